//! Which Kafka partition a grouping key belongs to: the key rendered as record keys are
//! (as the sink renders output keys), and Kafka's default partitioner (the Java client's
//! `murmur2`, which librdkafka's `murmur2_random` reproduces).

use std::collections::BTreeMap;

use serde_json::value::RawValue;

/// Kafka's `Utils.murmur2`: MurmurHash2, 32 bits, seed `0x9747b28c`, as the Java client
/// hashes record keys to choose their partition.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        // Java's switch falls through: the third byte, then the second, then the first.
        if tail.len() == 3 {
            h ^= u32::from(tail[2]) << 16;
        }
        if tail.len() >= 2 {
            h ^= u32::from(tail[1]) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions` by the Java client's default partitioner:
/// `(murmur2(key) & 0x7fffffff) % partitions`.
pub fn java_partition(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0, "a topic has at least one partition");
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// The record key a row's grouping key makes: for one string column its text, for another
/// single column its JSON text, for several the JSON array of their values (as
/// `KafkaSink` renders output record keys). Values are in the engine's canonical form
/// (`1.0` and `1e0` are one key to the engine, so they must be one record key here); a null
/// single column renders as `null` (the sink sends no key then, but a key with no
/// partition would let the rows of one key spread over partitions).
pub fn grouping_key(row: &str, columns: &[String]) -> Result<Vec<u8>, String> {
    let fields: BTreeMap<String, &RawValue> = serde_json::from_str(row)
        .map_err(|e| format!("the record's value is not a JSON object: {e}"))?;
    let mut values = Vec::with_capacity(columns.len());
    for c in columns {
        let raw = fields
            .get(c)
            .ok_or_else(|| format!("the row has no grouping key column `{c}`"))?;
        let value: serde_json::Value = serde_json::from_str(raw.get())
            .map_err(|e| format!("grouping key column `{c}` is not JSON: {e}"))?;
        values.push(value);
    }
    Ok(match values.as_slice() {
        [serde_json::Value::String(s)] => s.clone().into_bytes(),
        [one] => one.to_string().into_bytes(),
        many => serde_json::Value::Array(many.to_vec())
            .to_string()
            .into_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own test vectors (`UtilsTest.testMurmur2`).
    #[test]
    fn murmur2_matches_the_java_client() {
        for (data, want) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ] {
            assert_eq!(murmur2(data), want, "{}", String::from_utf8_lossy(data));
        }
        // A negative hash is made positive before the modulo (not negated, not abs()).
        assert_eq!(
            java_partition(b"21", 6),
            (-973_932_308i32 & 0x7fff_ffff) % 6
        );
        assert_eq!(java_partition(b"21", 6), 0);
        assert_eq!(java_partition(b"foobar", 7), 0);
        assert_eq!(java_partition(b"abc", 7), 479_470_107 % 7);
    }

    #[test]
    fn grouping_keys_render_as_record_keys() {
        let cols = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let row = r#"{"user":"u\u0031","n":1.0,"m":7,"z":null,"o":{"b":1, "a":2}}"#;
        assert_eq!(grouping_key(row, &cols(&["user"])).unwrap(), b"u1");
        assert_eq!(grouping_key(row, &cols(&["n"])).unwrap(), b"1.0");
        assert_eq!(grouping_key(row, &cols(&["m"])).unwrap(), b"7");
        assert_eq!(grouping_key(row, &cols(&["z"])).unwrap(), b"null");
        assert_eq!(
            grouping_key(row, &cols(&["user", "m"])).unwrap(),
            br#"["u1",7]"#
        );
        // The engine's canonical form: equal values, one key however they were spelled.
        assert_eq!(
            grouping_key(r#"{"n":1e0}"#, &cols(&["n"])).unwrap(),
            grouping_key(r#"{"n":1.0}"#, &cols(&["n"])).unwrap()
        );
        let e = grouping_key(row, &cols(&["nope"])).unwrap_err();
        assert!(e.contains("no grouping key column `nope`"), "{e}");
        assert!(grouping_key("[1]", &cols(&["n"])).is_err());
    }
}
