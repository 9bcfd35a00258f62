//! Checks and conversions for the scalar types carried as JSON strings: binary (base64),
//! date and timestamp. Each returns a short reason on failure, which callers place after
//! "expected X, found Y: ".

const MILLIS_PER_DAY: i64 = 86_400_000;

/// Checks standard, padded base64 (RFC 4648 §4). Non-zero bits in the last character's
/// unused low bits are rejected so that every byte string has exactly one accepted text,
/// which keeps canonical encodings unique.
pub(crate) fn check_base64(s: &str) -> Result<(), &'static str> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(4) {
        return Err("base64 text must be padded with `=` to a multiple of 4 characters");
    }
    let pad = match b {
        [.., b'=', b'='] => 2,
        [.., b'='] => 1,
        _ => 0,
    };
    let data = &b[..b.len() - pad];
    let mut last = 0;
    for &c in data {
        last = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return Err("base64 text may only hold A-Z, a-z, 0-9, `+`, `/` and trailing `=`"),
        };
    }
    let unused_bits_mask = match pad {
        1 => 0b11,
        2 => 0b1111,
        _ => 0,
    };
    if last & unused_bits_mask != 0 {
        return Err("base64 text has non-zero padding bits");
    }
    Ok(())
}

/// Parses `YYYY-MM-DD` (years 0000-9999) into days since 1970-01-01.
pub(crate) fn parse_date(s: &str) -> Result<i64, &'static str> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return Err("a date must look like \"YYYY-MM-DD\"");
    }
    let year = digits(&b[0..4]).ok_or("a date must look like \"YYYY-MM-DD\"")?;
    let month = digits(&b[5..7]).ok_or("a date must look like \"YYYY-MM-DD\"")?;
    let day = digits(&b[8..10]).ok_or("a date must look like \"YYYY-MM-DD\"")?;
    if !(1..=12).contains(&month) {
        return Err("the month is not between 01 and 12");
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err("the day does not exist in that month");
    }
    Ok(days_from_civil(year, month, day))
}

/// Parses an ISO-8601 / RFC 3339 timestamp into milliseconds since the Unix epoch.
///
/// Accepted: `YYYY-MM-DD`, optionally followed by `T` (or `t` or a space) and
/// `HH:MM[:SS[.fraction]]`, optionally followed by `Z`, `z`, `+HH:MM`, `+HHMM` or `+HH`.
/// Without an offset the time is read as UTC. Fractions finer than a millisecond are
/// truncated (Statebox timestamps have millisecond precision).
pub(crate) fn parse_timestamp(s: &str) -> Result<i64, &'static str> {
    const SHAPE: &str = "a timestamp must look like \"2024-01-31T12:00:00Z\" (ISO-8601)";
    let b = s.as_bytes();
    if b.len() < 10 {
        return Err(SHAPE);
    }
    let days = parse_date(&s[..10]).map_err(|_| SHAPE)?;
    let mut millis = days * MILLIS_PER_DAY;
    let mut rest = &b[10..];
    if rest.is_empty() {
        return Ok(millis);
    }
    if !matches!(rest[0], b'T' | b't' | b' ') || rest.len() < 6 || rest[3] != b':' {
        return Err(SHAPE);
    }
    let hour = digits(&rest[1..3]).ok_or(SHAPE)?;
    let minute = digits(&rest[4..6]).ok_or(SHAPE)?;
    rest = &rest[6..];
    let mut second = 0;
    if let [b':', s1, s2, tail @ ..] = rest {
        second = digits(&[*s1, *s2]).ok_or(SHAPE)?;
        rest = tail;
        if let [b'.', tail @ ..] = rest {
            let n = tail.iter().take_while(|b| b.is_ascii_digit()).count();
            if n == 0 || n > 9 {
                return Err("the fraction of a second must have 1 to 9 digits");
            }
            let mut frac_ms = 0;
            for (i, d) in tail[..n].iter().enumerate() {
                if i < 3 {
                    frac_ms = frac_ms * 10 + i64::from(d - b'0');
                }
            }
            for _ in n..3 {
                frac_ms *= 10;
            }
            millis += frac_ms;
            rest = &tail[n..];
        }
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err("the time of day is out of range");
    }
    millis += (hour * 3600 + minute * 60 + second) * 1000;
    let offset_minutes = match rest {
        [] | [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), tail @ ..] => {
            let (h, m) = match tail {
                [h1, h2] => (digits(&[*h1, *h2]), Some(0)),
                [h1, h2, m1, m2] | [h1, h2, b':', m1, m2] => {
                    (digits(&[*h1, *h2]), digits(&[*m1, *m2]))
                }
                _ => (None, None),
            };
            let (Some(h), Some(m)) = (h, m) else {
                return Err("the UTC offset must look like `+02:00`, `+0200` or `Z`");
            };
            if h > 23 || m > 59 {
                return Err("the UTC offset is out of range");
            }
            let minutes = h * 60 + m;
            if *sign == b'-' { -minutes } else { minutes }
        }
        _ => return Err(SHAPE),
    };
    Ok(millis - offset_minutes * 60_000)
}

/// Parses a JSON-style number written in a map key string, rejecting `inf`, `NaN` and
/// other spellings Rust's parser accepts but JSON does not.
pub(crate) fn parse_number_text(s: &str) -> Option<f64> {
    let json_like = s
        .bytes()
        .next()
        .is_some_and(|b| b == b'-' || b.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'));
    if !json_like {
        return None;
    }
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Parses ASCII decimal digits (at most 4 are ever passed).
fn digits(b: &[u8]) -> Option<i64> {
    b.iter().try_fold(0i64, |acc, &d| {
        d.is_ascii_digit().then(|| acc * 10 + i64::from(d - b'0'))
    })
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 in the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64() {
        for ok in [
            "", "AA==", "AAA=", "AAAA", "aGVsbG8=", "aGVsbG8h", "+/+/", "aGk=",
        ] {
            assert_eq!(check_base64(ok), Ok(()), "{ok}");
        }
        for bad in [
            "A",
            "AAA",
            "aGVsbG8",
            "aGk",
            "a=Gk",
            "aG-k",
            "aG_k",
            "AB==",
            "AAB=",
            "====",
            "a ==",
            "aGVsbG8=\n",
        ] {
            assert!(check_base64(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dates() {
        assert_eq!(parse_date("1970-01-01"), Ok(0));
        assert_eq!(parse_date("1970-01-02"), Ok(1));
        assert_eq!(parse_date("1969-12-31"), Ok(-1));
        assert_eq!(parse_date("2000-03-01"), Ok(11_017));
        assert!(parse_date("2024-02-29").is_ok());
        assert!(parse_date("2000-02-29").is_ok());
        assert!(parse_date("0000-01-01").is_ok());
        assert!(parse_date("9999-12-31").is_ok());
        for bad in [
            "2023-02-29",
            "1900-02-29",
            "2024-13-01",
            "2024-00-10",
            "2024-04-31",
            "2024-01-00",
            "2024-1-01",
            "24-01-01",
            "2024/01/01",
            "2024-01-01T",
            "",
            "abcd-ef-gh",
            "+024-01-01",
        ] {
            assert!(parse_date(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn timestamps() {
        let base = 1_704_067_200_000; // 2024-01-01T00:00:00Z
        let cases = [
            ("2024-01-01T00:00:00Z", base),
            ("2024-01-01", base),
            ("2024-01-01T00:00", base),
            ("2024-01-01 00:00:00", base),
            ("2024-01-01t00:00:00z", base),
            ("2024-01-01T00:00:00.123Z", base + 123),
            ("2024-01-01T00:00:00.1Z", base + 100),
            ("2024-01-01T00:00:00.123999999Z", base + 123),
            ("2024-01-01T00:00:00.123+02:00", base + 123 - 7_200_000),
            ("2024-01-01T00:00:00-0130", base + 5_400_000),
            ("2024-01-01T00:00:00+05", base - 18_000_000),
            (
                "2024-01-01T12:34:56Z",
                base + (12 * 3600 + 34 * 60 + 56) * 1000,
            ),
            ("1970-01-01T00:00:00Z", 0),
            ("1969-12-31T23:59:59.999Z", -1),
        ];
        for (text, millis) in cases {
            assert_eq!(parse_timestamp(text), Ok(millis), "{text}");
        }
        for bad in [
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:60:00Z",
            "2024-01-01T00:00:60Z",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00.1234567890Z",
            "2024-01-01T00:00:00+2",
            "2024-01-01T00:00:00+25:00",
            "2024-01-01T00:00:00 UTC",
            "2024-01-01T",
            "2024-01-01T1:00",
            "2024-02-30T00:00:00Z",
            "yesterday",
            "1704067200000",
        ] {
            assert!(parse_timestamp(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn number_text() {
        assert_eq!(parse_number_text("1.5"), Some(1.5));
        assert_eq!(parse_number_text("-2e3"), Some(-2000.0));
        for bad in ["inf", "NaN", "", "+1", "1e999", "0x10", " 1"] {
            assert_eq!(parse_number_text(bad), None, "{bad}");
        }
    }
}
