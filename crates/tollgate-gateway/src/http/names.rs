//! Header names known by their place in a connection's heads. A peer writes the same names in
//! the same order head after head (a client's requests, an upstream's responses): a name
//! written exactly as the one at its position in an earlier head is that one, cloned, not
//! parsed (and a custom one allocated) again. Read by decision mode's plain requests
//! (`plain.rs`) and by the proxy's upstream responses (`proxy/h1.rs`).

use http::HeaderName;

/// The longest header name kept (`x-forwarded-for` is 15 bytes, `sec-ch-ua-platform-version`
/// 26).
pub(crate) const KEPT_NAME: usize = 32;

/// The header positions a name is kept for: a browser's request has about 15 fields.
pub(crate) const KEPT_POSITIONS: usize = 32;

/// A connection's names by position: only the first [`KEPT_POSITIONS`] positions, one name
/// each, of at most [`KEPT_NAME`] bytes, so a connection keeps at most 3.5 KiB (a test holds
/// it to 4 KiB) whatever names its peer sends; a peer that varies them only misses.
#[derive(Default)]
pub(crate) struct Names {
    kept: Vec<Option<Known>>,
}

/// A header name as a head wrote it, and the name it is.
struct Known {
    raw: [u8; KEPT_NAME],
    len: usize,
    name: HeaderName,
}

impl Names {
    /// The header name `raw`, the `i`th of its head; `None` when it is not one.
    pub(crate) fn name(&mut self, i: usize, raw: &[u8]) -> Option<HeaderName> {
        if let Some(Some(known)) = self.kept.get(i) {
            if known.raw.get(..known.len) == Some(raw) {
                return Some(known.name.clone());
            }
        }
        let name = well_known(HeaderName::from_bytes(raw).ok()?);
        if i <= self.kept.len() && i < KEPT_POSITIONS {
            let known = (raw.len() <= KEPT_NAME).then(|| {
                let mut kept = [0; KEPT_NAME];
                kept[..raw.len()].copy_from_slice(raw);
                Known {
                    raw: kept,
                    len: raw.len(),
                    name: name.clone(),
                }
            });
            match self.kept.get_mut(i) {
                Some(slot) => *slot = known,
                None => self.kept.push(known),
            }
        }
        Some(name)
    }

    /// The names kept, by position (`-` where none is).
    #[cfg(test)]
    pub(crate) fn kept(&self) -> Vec<String> {
        self.kept
            .iter()
            .map(|k| k.as_ref().map_or("-", |k| k.name.as_str()).to_owned())
            .collect()
    }

    /// What the names kept hold at most: the slots there is room for (read from the list, so
    /// a list grown past its bound shows) and, for each, a custom name's own bytes on the
    /// heap (at most [`KEPT_NAME`]; a standard name has none).
    #[cfg(test)]
    pub(crate) fn bytes_at_most(&self) -> usize {
        self.kept.capacity() * (std::mem::size_of::<Option<Known>>() + KEPT_NAME)
    }
}

/// Request header names that `http` does not know but requests often carry (API keys, the
/// forwarding and tracing headers). A name read is one of these as a static name: a custom
/// name's bytes are shared, and each clone of it (a request's, from the names kept) is a
/// locked instruction to take and one to drop, where a static name's are none.
static WELL_KNOWN: &[&str] = &[
    "x-api-key",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-real-ip",
    "x-request-id",
    "x-correlation-id",
    "x-user-id",
    "x-tenant-id",
    "traceparent",
    "tracestate",
    "x-amzn-trace-id",
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-sampled",
    "x-requested-with",
    "x-csrf-token",
    "keep-alive",
    "priority",
    "sec-ch-ua",
    "sec-ch-ua-mobile",
    "sec-ch-ua-platform",
    "sec-fetch-dest",
    "sec-fetch-mode",
    "sec-fetch-site",
    "sec-fetch-user",
];

/// `name` as a static name when it is one of [`WELL_KNOWN`] (the same name), else itself.
fn well_known(name: HeaderName) -> HeaderName {
    match WELL_KNOWN.iter().find(|w| **w == name.as_str()) {
        Some(w) => HeaderName::from_static(w),
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_names_are_the_names_read_and_others_are_left_as_read() {
        for w in WELL_KNOWN {
            // Each is a valid lowercase name that `http` does not know as standard (a
            // standard one would gain nothing here).
            let parsed = HeaderName::from_bytes(w.to_ascii_uppercase().as_bytes()).expect("name");
            assert_eq!(parsed.as_str(), *w);
            let known = well_known(parsed.clone());
            assert_eq!(known, parsed);
            assert_eq!(known.as_str(), *w);
            // The static name itself (its bytes the list's, with no reference count), which
            // `http` would not give for a name it knows as standard.
            assert!(std::ptr::eq(known.as_str().as_ptr(), w.as_ptr()), "{w}");
        }
        for other in ["x-api-keys", "x-custom", "host", "x-api-ke"] {
            let parsed = HeaderName::from_bytes(other.as_bytes()).expect("name");
            assert_eq!(well_known(parsed.clone()).as_str(), parsed.as_str());
        }
        // Read by position as any other name.
        let mut names = Names::default();
        for _ in 0..3 {
            let n = names.name(0, b"X-Api-Key").expect("a name");
            assert_eq!(n, HeaderName::from_static("x-api-key"));
        }
    }
}
