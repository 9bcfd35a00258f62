//! The stored value codec.
//!
//! Layout: `[format version u8][flags u8][schema id LEB128 u32][expiry i64 BE, if flagged]
//! [payload]`. The header is tiny (3 bytes for a value without TTL and a small schema id) and
//! can be read without copying the payload, which is how reads hide expired values cheaply.

use crate::{Result, StoreError};

/// The only format version written so far.
const FORMAT_V1: u8 = 1;
/// Flag bit: an expiry follows the schema id.
const FLAG_EXPIRY: u8 = 0b0000_0001;
/// Every flag bit this version knows; any other set bit means the bytes are not ours.
const KNOWN_FLAGS: u8 = FLAG_EXPIRY;
/// The longest LEB128 encoding of a `u32`.
const MAX_VARINT_LEN: usize = 5;

/// One stored value: a value state's value, a list element or a map entry's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredValue {
    /// Index into the variable's schema history.
    pub schema_id: u32,
    /// TTL expiry in ms; `None` means the value never expires.
    pub expires_at_ms: Option<i64>,
    /// JSON text, already validated by the runtime.
    pub payload: Vec<u8>,
}

/// The decoded header of a stored value, borrowed from its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header<'a> {
    pub(crate) schema_id: u32,
    pub(crate) expires_at_ms: Option<i64>,
    pub(crate) payload: &'a [u8],
}

impl StoredValue {
    /// Encodes the value into its stored form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + MAX_VARINT_LEN + 8 + self.payload.len());
        self.encode_into(&mut out);
        out
    }

    /// Appends the stored form of the value to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let flags = if self.expires_at_ms.is_some() {
            FLAG_EXPIRY
        } else {
            0
        };
        out.push(FORMAT_V1);
        out.push(flags);
        let mut id = self.schema_id;
        while id >= 0x80 {
            // Truncation is the point: the low 7 bits go out with the continuation bit set.
            out.push((id as u8 & 0x7f) | 0x80);
            id >>= 7;
        }
        out.push(id as u8);
        if let Some(expiry) = self.expires_at_ms {
            out.extend_from_slice(&expiry.to_be_bytes());
        }
        out.extend_from_slice(&self.payload);
    }

    /// Decodes a stored value; bytes that are not a valid encoding give
    /// [`StoreError::Corrupt`].
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        Header::decode(bytes).map(Header::to_owned)
    }
}

impl<'a> Header<'a> {
    /// Decodes the header and borrows the payload.
    pub(crate) fn decode(bytes: &'a [u8]) -> Result<Self> {
        let [version, flags, rest @ ..] = bytes else {
            return Err(corrupt("stored value shorter than its header"));
        };
        if *version != FORMAT_V1 {
            return Err(corrupt(format!(
                "unknown stored value format version {version}"
            )));
        }
        if flags & !KNOWN_FLAGS != 0 {
            return Err(corrupt(format!("unknown stored value flags {flags:#04x}")));
        }
        let (schema_id, rest) = decode_varint_u32(rest)?;
        let (expires_at_ms, payload) = if flags & FLAG_EXPIRY != 0 {
            let Some((expiry, payload)) = rest.split_first_chunk::<8>() else {
                return Err(corrupt("stored value expiry is truncated"));
            };
            (Some(i64::from_be_bytes(*expiry)), payload)
        } else {
            (None, rest)
        };
        Ok(Self {
            schema_id,
            expires_at_ms,
            payload,
        })
    }

    /// Whether the value is visible at TTL clock `now` (`None`: no clock, all visible).
    pub(crate) fn is_live(&self, now: Option<i64>) -> bool {
        match (self.expires_at_ms, now) {
            (Some(expiry), Some(now)) => expiry > now,
            _ => true,
        }
    }

    pub(crate) fn to_owned(self) -> StoredValue {
        StoredValue {
            schema_id: self.schema_id,
            expires_at_ms: self.expires_at_ms,
            payload: self.payload.to_vec(),
        }
    }
}

fn decode_varint_u32(bytes: &[u8]) -> Result<(u32, &[u8])> {
    let mut value = 0u32;
    for (i, &byte) in bytes.iter().enumerate().take(MAX_VARINT_LEN) {
        let bits = u32::from(byte & 0x7f);
        // The fifth byte may only carry the top 4 bits of a u32.
        if i == MAX_VARINT_LEN - 1 && bits > 0x0f {
            return Err(corrupt("stored value schema id overflows u32"));
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, &bytes[i + 1..]));
        }
    }
    Err(corrupt("stored value schema id is truncated or too long"))
}

fn corrupt(msg: impl Into<String>) -> StoreError {
    StoreError::Corrupt(msg.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(v: &StoredValue) {
        let bytes = v.encode();
        assert_eq!(&StoredValue::decode(&bytes).unwrap(), v);
    }

    #[test]
    fn roundtrips_edge_values() {
        for schema_id in [0, 1, 127, 128, 16_383, 16_384, u32::MAX - 1, u32::MAX] {
            for expires_at_ms in [None, Some(i64::MIN), Some(-1), Some(0), Some(i64::MAX)] {
                for payload in [&b""[..], b"{}", b"{\"a\":[1,2,3]}"] {
                    roundtrip(&StoredValue {
                        schema_id,
                        expires_at_ms,
                        payload: payload.to_vec(),
                    });
                }
            }
        }
    }

    #[test]
    fn small_values_have_a_three_byte_header() {
        let v = StoredValue {
            schema_id: 3,
            expires_at_ms: None,
            payload: b"42".to_vec(),
        };
        assert_eq!(v.encode(), [1, 0, 3, b'4', b'2']);
    }

    #[test]
    fn rejects_garbage() {
        let bad: &[&[u8]] = &[
            b"",
            &[1],
            &[2, 0, 0],
            &[1, 0x80, 0],
            &[1, 0, 0x80],
            &[1, 0, 0xff, 0xff, 0xff, 0xff, 0x1f],
            &[1, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
            &[1, 1, 0, 1, 2, 3],
            b"{\"json\":true}",
        ];
        for bytes in bad {
            assert!(
                matches!(StoredValue::decode(bytes), Err(StoreError::Corrupt(_))),
                "{bytes:?} decoded"
            );
        }
    }

    #[test]
    fn liveness_follows_the_ttl_clock() {
        let bytes = StoredValue {
            schema_id: 0,
            expires_at_ms: Some(100),
            payload: vec![],
        }
        .encode();
        let h = Header::decode(&bytes).unwrap();
        assert!(h.is_live(None));
        assert!(h.is_live(Some(99)));
        assert!(!h.is_live(Some(100)));
        let never = StoredValue {
            schema_id: 0,
            expires_at_ms: None,
            payload: vec![],
        }
        .encode();
        assert!(Header::decode(&never).unwrap().is_live(Some(i64::MAX)));
    }
}
