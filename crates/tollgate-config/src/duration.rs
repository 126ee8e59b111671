//! Durations as the config writes them; the parser is shared with `tollgate bench`'s flags.

pub use tollgate_core::duration::{parse_duration, DURATION_HELP};
