//! Identities are hashed with a keyed hash before they reach any store, so raw API keys never
//! leave the process and a store dump cannot be reversed without the secret.

use tollgate_core::ClientKey;

/// The longest identity (source, separator and value) hashed from one stack buffer; longer
/// ones are streamed.
const ONE_SHOT: usize = 256;

/// Turns an identity (its source and value) into a [`ClientKey`] with keyed BLAKE3.
#[derive(Clone)]
pub struct IdentityHasher {
    key: [u8; 32],
}

impl std::fmt::Debug for IdentityHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityHasher { key: <redacted> }")
    }
}

impl IdentityHasher {
    /// A hasher keyed by `secret` (any length; it is stretched with BLAKE3's key derivation).
    pub fn new(secret: &[u8]) -> Self {
        Self {
            key: blake3::derive_key("tollgate 2026-11 client identity key", secret),
        }
    }

    /// The client key of `value` as read from `source` (e.g. `header:x-api-key`, `ip`). The
    /// source is part of the hash, so the same string from two sources is two clients. Any
    /// length and any bytes are accepted.
    pub fn client_key(&self, source: &str, value: &[u8]) -> ClientKey {
        self.client_key_parts(&[source.as_bytes()], value)
    }

    /// [`IdentityHasher::client_key`] with the source name given in pieces (`"header:"` and
    /// the header's name, say), hashed as their concatenation: the same key, without building
    /// the name on every request.
    pub fn client_key_parts(&self, source: &[&[u8]], value: &[u8]) -> ClientKey {
        let len = source.iter().map(|p| p.len()).sum::<usize>() + 1 + value.len();
        let out = if len <= ONE_SHOT {
            // The whole input in one buffer, hashed in one call: BLAKE3's one-shot hash skips
            // the streaming hasher's work per update (about 400 of a request's 1,100
            // instructions here, under callgrind). The hash of the same bytes either way.
            let mut buf = [0u8; ONE_SHOT];
            let mut at = 0;
            for part in source.iter().copied().chain([&[0u8][..], value]) {
                if let Some(to) = buf.get_mut(at..at + part.len()) {
                    to.copy_from_slice(part);
                }
                at += part.len();
            }
            blake3::keyed_hash(&self.key, &buf[..at.min(ONE_SHOT)])
        } else {
            let mut h = blake3::Hasher::new_keyed(&self.key);
            for part in source {
                h.update(part);
            }
            h.update(&[0]);
            h.update(value);
            h.finalize()
        };
        Self::truncated(&out)
    }

    /// [`IdentityHasher::client_key`] of an identity its caller has already joined into
    /// one buffer: `joined` is the source's bytes, a 0 byte, then the value's. The same key as
    /// from the parts, without copying them into a buffer of this function's own (a caller
    /// that builds the identity anyway, as the RLS does for each descriptor, writes it here
    /// first).
    pub fn client_key_joined(&self, joined: &[u8]) -> ClientKey {
        Self::truncated(&blake3::keyed_hash(&self.key, joined))
    }

    fn truncated(out: &blake3::Hash) -> ClientKey {
        let mut k = [0u8; 16];
        k.copy_from_slice(&out.as_bytes()[..16]);
        ClientKey(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Identities short enough for one buffer and longer ones (streamed) hash to what the
    /// streaming hasher gives for the same bytes: no client changes its key (nor its Redis
    /// key) across the two paths or across this change.
    #[test]
    fn one_buffer_and_streaming_give_the_same_key() {
        let h = IdentityHasher::new(b"secret");
        let streamed = |source: &[u8], value: &[u8]| {
            let mut s = blake3::Hasher::new_keyed(&h.key);
            s.update(source);
            s.update(&[0]);
            s.update(value);
            let mut k = [0u8; 16];
            k.copy_from_slice(&s.finalize().as_bytes()[..16]);
            ClientKey(k)
        };
        let source = b"header:x-api-key";
        for len in [0, 1, 64, 238, 239, 240, 255, 256, 1024, 5000] {
            let value: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            assert_eq!(
                h.client_key_parts(&[b"header:", b"x-api-key"], &value),
                streamed(source, &value),
                "a value of {len} bytes"
            );
        }
        // A key written down before this path existed: the keys every store already holds
        // stay where they are.
        let k = IdentityHasher::new(b"bench").client_key("ip", b"127.0.0.1");
        let hex: String = k.0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "9ef347243136c9596ff8992c354fcad7");
    }

    /// An identity joined by its caller is the key of its parts, short or long.
    #[test]
    fn a_joined_identity_is_the_same_key() {
        let h = IdentityHasher::new(b"s");
        for len in [0, 1, 200, 251, 252, 300, 5000] {
            let value: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
            let mut joined = b"rls\0".to_vec();
            joined.extend_from_slice(&value);
            assert_eq!(
                h.client_key_joined(&joined),
                h.client_key("rls", &value),
                "a value of {len} bytes"
            );
        }
        assert_ne!(h.client_key_joined(b"rls\0v"), h.client_key("rls", b"\0v"));
    }

    #[test]
    fn a_source_in_pieces_is_the_same_key() {
        let h = IdentityHasher::new(b"s");
        assert_eq!(
            h.client_key_parts(&[b"header:", b"x-api-key"], b"v"),
            h.client_key("header:x-api-key", b"v")
        );
        assert_ne!(
            h.client_key_parts(&[b"header:", b"x-api-key"], b"v"),
            h.client_key("header:x-api-keyv", b"")
        );
    }

    #[test]
    fn same_identity_same_key_other_secret_other_key() {
        let a = IdentityHasher::new(b"s1");
        let b = IdentityHasher::new(b"s2");
        assert_eq!(
            a.client_key("ip", b"1.2.3.4"),
            a.client_key("ip", b"1.2.3.4")
        );
        assert_ne!(
            a.client_key("ip", b"1.2.3.4"),
            b.client_key("ip", b"1.2.3.4")
        );
    }

    #[test]
    fn source_is_part_of_the_identity() {
        let h = IdentityHasher::new(b"s");
        assert_ne!(
            h.client_key("ip", b"1.2.3.4"),
            h.client_key("header:x-api-key", b"1.2.3.4")
        );
    }

    #[test]
    fn huge_and_non_utf8_identities_hash() {
        let h = IdentityHasher::new(b"s");
        let big = vec![0xffu8; 1 << 20];
        let k = h.client_key("header:x-api-key", &big);
        assert_ne!(k, h.client_key("header:x-api-key", &big[1..]));
    }

    #[test]
    fn debug_redacts_the_key() {
        let h = IdentityHasher::new(b"topsecret");
        assert!(format!("{h:?}").contains("redacted"));
    }
}
