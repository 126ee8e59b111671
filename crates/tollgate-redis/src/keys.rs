//! A plan's Redis keys, kept together.

use smallvec::SmallVec;

/// A plan's Redis keys in rule order, written one after the other into one buffer: one
/// allocation a plan of up to two rules and two past that (the ends outgrow their inline
/// room, which stays small: a check's future carries it), where a `String` a key cost a plan
/// of ten rules eleven (its keys and the vector past its one inline key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Keys {
    text: Vec<u8>,
    /// Where each key ends in `text`.
    ends: SmallVec<[u32; 2]>,
}

impl Keys {
    /// Room for `keys` keys of `bytes` bytes in all.
    pub(crate) fn with_capacity(keys: usize, bytes: usize) -> Self {
        Keys {
            text: Vec::with_capacity(bytes),
            ends: SmallVec::with_capacity(keys),
        }
    }

    /// The key being written: its bytes go on after the last key's.
    pub(crate) fn text_mut(&mut self) -> &mut Vec<u8> {
        &mut self.text
    }

    /// Ends the key being written.
    pub(crate) fn end_key(&mut self) {
        // A plan's keys are a few hundred bytes (at most MAX_INLINE_RULES keys of bounded
        // prefix and policy names); a buffer past 4 GiB cannot be sent anyway.
        self.ends
            .push(u32::try_from(self.text.len()).unwrap_or(u32::MAX));
    }

    /// A whole key.
    pub(crate) fn push(&mut self, key: &[u8]) {
        self.text.extend_from_slice(key);
        self.end_key();
    }

    /// How many keys.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The keys' bytes in all.
    pub(crate) fn bytes(&self) -> usize {
        self.text.len()
    }

    /// The keys in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut start = 0usize;
        self.ends.iter().map(move |&end| {
            let end = end as usize;
            let key = self.text.get(start..end).unwrap_or_default();
            start = end;
            key
        })
    }

    /// The first key.
    pub(crate) fn first(&self) -> Option<&[u8]> {
        self.iter().next()
    }
}

impl<S: AsRef<str>> FromIterator<S> for Keys {
    fn from_iter<I: IntoIterator<Item = S>>(keys: I) -> Self {
        let mut out = Keys::default();
        for k in keys {
            out.push(k.as_ref().as_bytes());
        }
        out
    }
}
