//! The protobuf codec of the generated gRPC clients (tests, `tollgate bench --rls`): prost's,
//! with small buffers. (The server side frames its messages itself, in [`crate::wire`].)
//!
//! tonic's default codec starts each call's encode and decode buffers at 8 KiB. Envoy's
//! messages are a few hundred bytes: the buffers here start at [`BUFFER_BYTES`] and grow only
//! for a message that needs it. (They were chosen for tonic's server, where an answer that
//! the peer's flow control held back kept its buffer until the stream ended.)

use prost::Message;
use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The size each call's encode and decode buffer starts at.
pub const BUFFER_BYTES: usize = 512;

/// Past this many bytes encoded in one go, a streaming encoder yields (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
}

/// prost's codec with [`BUFFER_BYTES`] buffers (named by build.rs for the generated services).
#[derive(Debug, Clone)]
pub struct SmallCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for SmallCodec<T, U> {
    fn default() -> Self {
        Self {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for SmallCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
