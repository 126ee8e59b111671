//! A `RateLimitRequest` read in place: its strings are slices of the message's bytes.
//!
//! prost's generated decoder gives every string its own allocation (a request of ten
//! descriptors has twenty-one) and grows every list as it goes; under callgrind that was
//! about a tenth of a ten-descriptor decision. This reader accepts exactly the messages prost
//! accepts, reads them as prost does and refuses the others in prost's words (the fields it
//! was in, then what was wrong), which the differential tests hold it to:
//!
//! - a field prost knows, with another wire type, is an error; an unknown field is skipped
//!   (groups included, nested at most as deep as prost's recursion limit allows);
//! - a varint is at most ten bytes, the tenth at most 1; a key is at most `u32::MAX` and its
//!   field number is not 0; a length past the end of its message is an error;
//! - a string must be UTF-8;
//! - a scalar field given twice keeps the last value; a message field given twice (a
//!   descriptor's `limit`, its `hits_addend`) merges the second into the first; a repeated
//!   field appends;
//! - `uint32` and enum values are the varint's low 32 bits, as prost casts them.
//!
//! What it keeps is bounded, not only what it reads ([`crate::MAX_MESSAGE_BYTES`]): the
//! service refuses a request of more than [`MAX_DESCRIPTORS`] descriptors or a descriptor of
//! more than [`MAX_ENTRIES`] entries, so descriptors and entries past one more than those are
//! read (a message prost refuses is still refused) and dropped. A request is held while the
//! rest of its body is awaited (up to the call's deadline, 1,024 calls from one address).
//! Counted by the structs' sizes and their lists' capacities: a 64 KiB message of empty
//! descriptors decoded to 32,000 of them, 1.75 MiB under prost (56 bytes each; 112 in this
//! reader), and keeps 56 KiB here; a 64 KiB message of 492 descriptors of 65 empty entries
//! kept 2.9 MiB under prost and keeps 1.06 MiB here (257 descriptors, their entry lists grown
//! to 128). A valid request of 256 descriptors of 64 entries needs about half of that.

use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use smallvec::SmallVec;
use std::fmt;

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 256;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 64;

/// A `RateLimitRequest` whose strings borrow the message's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RlsRequest<'a> {
    /// `domain` (1).
    pub domain: &'a str,
    /// `descriptors` (2): decoded, at most [`MAX_DESCRIPTORS`] + 1 of them (one more than
    /// the service accepts: the rest are read and dropped).
    pub descriptors: Vec<Descriptor<'a>>,
    /// `hits_addend` (3).
    pub hits_addend: u32,
}

/// A request's `RateLimitDescriptor`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Descriptor<'a> {
    /// `entries` (1). Two inline: most descriptors have one or two. Decoded, at most
    /// [`MAX_ENTRIES`] + 1 of them (the rest are read and dropped).
    pub entries: SmallVec<[Entry<'a>; 2]>,
    /// `limit` (2): the request's own quota for this descriptor.
    pub limit: Option<Override>,
    /// `hits_addend` (3), a `google.protobuf.UInt64Value`.
    pub hits_addend: Option<u64>,
    /// `is_negative_hits` (4).
    pub is_negative_hits: bool,
}

/// A descriptor's entry: `key` (1) and `value` (2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry<'a> {
    /// The entry's key.
    pub key: &'a str,
    /// The entry's value.
    pub value: &'a str,
}

/// A descriptor's `RateLimitOverride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Override {
    /// `requests_per_unit` (1).
    pub requests_per_unit: u32,
    /// `unit` (2), an `envoy.type.v3.RateLimitUnit` (any value, as prost keeps it).
    pub unit: i32,
}

impl<'a> RlsRequest<'a> {
    /// The request `message` holds; every string borrows it.
    pub fn decode(message: &'a [u8]) -> Result<Self, DecodeError> {
        const NAME: &str = "RateLimitRequest";
        let mut r = Reader::new(message);
        // A descriptor takes at least two bytes and usually twenty or more: sized from the
        // message so that a usual request's list is never grown.
        let mut req = RlsRequest {
            descriptors: Vec::with_capacity((message.len() / 16).clamp(1, 64)),
            ..Self::default()
        };
        while !r.buf.is_empty() {
            let (field, wire) = r.key()?;
            match field {
                1 => req.domain = r.string(wire).map_err(|e| e.at(NAME, "domain"))?,
                2 => {
                    let mut d = Descriptor::default();
                    r.message(wire, ROOT, |r, depth| d.field(r, depth))
                        .map_err(|e| e.at(NAME, "descriptors"))?;
                    if req.descriptors.len() <= MAX_DESCRIPTORS {
                        req.descriptors.push(d);
                    }
                }
                3 => {
                    req.hits_addend =
                        r.varint_of(wire).map_err(|e| e.at(NAME, "hits_addend"))? as u32;
                }
                _ => r.skip(wire, field, ROOT)?,
            }
        }
        Ok(req)
    }

    /// `message`'s fields, borrowed.
    pub fn of(message: &'a RateLimitRequest) -> Self {
        RlsRequest {
            domain: &message.domain,
            descriptors: message
                .descriptors
                .iter()
                .map(|d| Descriptor {
                    entries: d
                        .entries
                        .iter()
                        .map(|e| Entry {
                            key: &e.key,
                            value: &e.value,
                        })
                        .collect(),
                    limit: d.limit.as_ref().map(|o| Override {
                        requests_per_unit: o.requests_per_unit,
                        unit: o.unit,
                    }),
                    hits_addend: d.hits_addend,
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            hits_addend: message.hits_addend,
        }
    }
}

impl<'a> Descriptor<'a> {
    /// The descriptor's entries as (key, value) pairs.
    pub fn pairs(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + Clone + '_ {
        self.entries.iter().map(|e| (e.key, e.value))
    }

    fn field(&mut self, r: &mut Reader<'a>, depth: u32) -> Result<(), DecodeError> {
        const NAME: &str = "RateLimitDescriptor";
        let (field, wire) = r.key()?;
        match field {
            1 => {
                let mut e = Entry::default();
                r.message(wire, depth, |r, depth| {
                    let (field, wire) = r.key()?;
                    match field {
                        1 => e.key = r.string(wire).map_err(|e| e.at("Entry", "key"))?,
                        2 => e.value = r.string(wire).map_err(|e| e.at("Entry", "value"))?,
                        _ => r.skip(wire, field, depth)?,
                    }
                    Ok(())
                })
                .map_err(|e| e.at(NAME, "entries"))?;
                if self.entries.len() <= MAX_ENTRIES {
                    self.entries.push(e);
                }
            }
            2 => {
                // Merged into the one given before, if any, as prost merges a message field.
                let o = self.limit.get_or_insert_with(Override::default);
                r.message(wire, depth, |r, depth| {
                    const NAME: &str = "RateLimitOverride";
                    let (field, wire) = r.key()?;
                    match field {
                        1 => {
                            o.requests_per_unit = r
                                .varint_of(wire)
                                .map_err(|e| e.at(NAME, "requests_per_unit"))?
                                as u32;
                        }
                        2 => o.unit = r.varint_of(wire).map_err(|e| e.at(NAME, "unit"))? as i32,
                        _ => r.skip(wire, field, depth)?,
                    }
                    Ok(())
                })
                .map_err(|e| e.at(NAME, "limit"))?;
            }
            3 => {
                // A `google.protobuf.UInt64Value`, whose one field prost reads without naming it.
                let h = self.hits_addend.get_or_insert(0);
                r.message(wire, depth, |r, depth| {
                    let (field, wire) = r.key()?;
                    match field {
                        1 => *h = r.varint_of(wire)?,
                        _ => r.skip(wire, field, depth)?,
                    }
                    Ok(())
                })
                .map_err(|e| e.at(NAME, "hits_addend"))?;
            }
            4 => {
                self.is_negative_hits = r
                    .varint_of(wire)
                    .map_err(|e| e.at(NAME, "is_negative_hits"))?
                    != 0;
            }
            _ => r.skip(wire, field, depth)?,
        }
        Ok(())
    }
}

/// prost's recursion limit, as its decoder counts it: the top-level message's fields are read
/// at this depth, a nested message's one lower, a group's fields one lower than the group;
/// nothing is read at 0.
const ROOT: u32 = 100;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const DELIMITED: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// Why a message could not be read, in prost's words: the fields it was in (the innermost
/// first), then what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(Box<Failure>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    kind: Kind,
    /// (message, field), innermost first.
    within: Vec<(&'static str, &'static str)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Varint,
    Key(u64),
    WireTypeValue(u64),
    Tag,
    WireType { actual: u8, expected: u8 },
    Underflow,
    Exceeded,
    EndGroup,
    Recursion,
    Utf8,
}

impl DecodeError {
    #[cold]
    #[inline(never)]
    fn at(mut self, message: &'static str, field: &'static str) -> Self {
        self.0.within.push((message, field));
        self
    }
}

impl From<Kind> for DecodeError {
    // Kept out of the reader's functions, so that they stay small enough to inline.
    #[cold]
    #[inline(never)]
    fn from(kind: Kind) -> Self {
        DecodeError(Box::new(Failure {
            kind,
            within: Vec::new(),
        }))
    }
}

/// A wire type as prost's `WireType` prints it.
fn wire_name(wire: u8) -> &'static str {
    match wire {
        VARINT => "Varint",
        FIXED64 => "SixtyFourBit",
        DELIMITED => "LengthDelimited",
        START_GROUP => "StartGroup",
        END_GROUP => "EndGroup",
        _ => "ThirtyTwoBit",
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("failed to decode Protobuf message: ")?;
        for (message, field) in &self.0.within {
            write!(f, "{message}.{field}: ")?;
        }
        match self.0.kind {
            Kind::Varint => f.write_str("invalid varint"),
            Kind::Key(key) => write!(f, "invalid key value: {key}"),
            Kind::WireTypeValue(value) => write!(f, "invalid wire type value: {value}"),
            Kind::Tag => f.write_str("invalid tag value: 0"),
            Kind::WireType { actual, expected } => write!(
                f,
                "invalid wire type: {} (expected {})",
                wire_name(actual),
                wire_name(expected)
            ),
            Kind::Underflow => f.write_str("buffer underflow"),
            Kind::Exceeded => f.write_str("delimited length exceeded"),
            Kind::EndGroup => f.write_str("unexpected end group tag"),
            Kind::Recursion => f.write_str("recursion limit reached"),
            Kind::Utf8 => f.write_str("invalid string value: data is not UTF-8 encoded"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The rest of the message, read as prost reads a `Buf`: a nested message is the next bytes
/// up to a limit, checked when its fields are read (so a field that runs past its message's
/// end is an error at that end, in prost's words).
struct Reader<'a> {
    buf: &'a [u8],
    /// The whole message, when all of it is UTF-8 (a request whose lengths are all below
    /// 128 bytes and whose strings are ASCII is): a string is then its slice of this text,
    /// valid wherever both its ends are character boundaries, which is one check a string
    /// instead of a UTF-8 pass over each (about 80 instructions a string under callgrind, a
    /// fortieth of a ten-descriptor request's decision).
    text: Option<&'a str>,
}

impl<'a> Reader<'a> {
    fn new(message: &'a [u8]) -> Self {
        Reader {
            buf: message,
            text: std::str::from_utf8(message).ok(),
        }
    }

    #[inline(always)]
    fn varint(&mut self) -> Result<u64, DecodeError> {
        // Keys, lengths and most values are one byte.
        if let Some((&b, rest)) = self.buf.split_first() {
            if b < 0x80 {
                self.buf = rest;
                return Ok(u64::from(b));
            }
        }
        self.long_varint()
    }

    fn long_varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for (n, &b) in self.buf.iter().take(10).enumerate() {
            value |= u64::from(b & 0x7f) << (7 * n);
            if b < 0x80 {
                // The tenth byte holds the 64th bit alone.
                if n == 9 && b > 1 {
                    break;
                }
                self.buf = &self.buf[n + 1..];
                return Ok(value);
            }
        }
        Err(Kind::Varint.into())
    }

    /// A field's number and wire type.
    #[inline(always)]
    fn key(&mut self) -> Result<(u32, u8), DecodeError> {
        let key = self.varint()?;
        let Ok(key32) = u32::try_from(key) else {
            return Err(Kind::Key(key).into());
        };
        let wire = (key32 & 7) as u8;
        if wire > FIXED32 {
            return Err(Kind::WireTypeValue(u64::from(wire)).into());
        }
        let field = key32 >> 3;
        if field == 0 {
            return Err(Kind::Tag.into());
        }
        Ok((field, wire))
    }

    #[inline(always)]
    fn expect(actual: u8, expected: u8) -> Result<(), DecodeError> {
        if actual == expected {
            Ok(())
        } else {
            Err(Kind::WireType { actual, expected }.into())
        }
    }

    #[inline(always)]
    fn varint_of(&mut self, wire: u8) -> Result<u64, DecodeError> {
        Self::expect(wire, VARINT)?;
        self.varint()
    }

    /// A length, no more than what is left.
    #[inline(always)]
    fn length(&mut self) -> Result<usize, DecodeError> {
        let len = self.varint()?;
        match usize::try_from(len) {
            Ok(len) if len <= self.buf.len() => Ok(len),
            _ => Err(Kind::Underflow.into()),
        }
    }

    #[inline(always)]
    fn string(&mut self, wire: u8) -> Result<&'a str, DecodeError> {
        Self::expect(wire, DELIMITED)?;
        let len = self.length()?;
        let (bytes, rest) = self.buf.split_at(len);
        self.buf = rest;
        if let Some(text) = self.text {
            // Where the string starts within the message (both borrow it).
            let start = bytes.as_ptr() as usize - text.as_ptr() as usize;
            // A slice of UTF-8 text is UTF-8 if and only if both its ends are boundaries:
            // a string cut there (its last byte starting a character the next field's bytes
            // complete) is refused by the check below, as prost refuses it.
            if let Some(s) = text.get(start..start + len) {
                return Ok(s);
            }
        }
        std::str::from_utf8(bytes).map_err(|_| Kind::Utf8.into())
    }

    /// A nested message read by `field`, called once per field with the depth its fields are
    /// at. `depth` is the depth of the message holding this field.
    fn message(
        &mut self,
        wire: u8,
        depth: u32,
        mut field: impl FnMut(&mut Reader<'a>, u32) -> Result<(), DecodeError>,
    ) -> Result<(), DecodeError> {
        Self::expect(wire, DELIMITED)?;
        if depth == 0 {
            return Err(Kind::Recursion.into());
        }
        let len = self.length()?;
        let limit = self.buf.len() - len;
        while self.buf.len() > limit {
            field(self, depth - 1)?;
        }
        if self.buf.len() != limit {
            return Err(Kind::Exceeded.into());
        }
        Ok(())
    }

    /// Skips an unknown field, as prost's `skip_field` does at `depth`.
    fn skip(&mut self, wire: u8, field: u32, depth: u32) -> Result<(), DecodeError> {
        if depth == 0 {
            return Err(Kind::Recursion.into());
        }
        let len = match wire {
            VARINT => {
                self.varint()?;
                0
            }
            FIXED64 => 8,
            FIXED32 => 4,
            DELIMITED => self.length()?,
            START_GROUP => loop {
                let (inner, inner_wire) = self.key()?;
                if inner_wire == END_GROUP {
                    if inner != field {
                        return Err(Kind::EndGroup.into());
                    }
                    break 0;
                }
                self.skip(inner_wire, inner, depth - 1)?;
            },
            _ => return Err(Kind::EndGroup.into()),
        };
        match self.buf.get(len..) {
            Some(rest) => {
                self.buf = rest;
                Ok(())
            }
            None => Err(Kind::Underflow.into()),
        }
    }
}

#[cfg(test)]
mod tests;
