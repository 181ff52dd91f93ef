//! Amounts as people write them on the command line: durations (`500ms`, `30s`, `2m`, `1h`, `1.5s`; a bare number
//! means seconds), a window's start as a time back from now (`7d`, `24h`) or a date, and sizes (`512M`, `1G`;
//! powers of 1024). How durations and times are written back is `clock.rs`.

use std::time::Duration;

/// Parses a duration for clap (`value_parser = parse_duration`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (value, unit) = number_and_unit(text).ok_or_else(|| {
        format!("`{text}` is not a duration: write a number with a unit, like 500ms, 30s, 2m or 1h")
    })?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" | "sec" | "secs" => value,
        "m" | "min" | "mins" => value * 60.0,
        "h" | "hour" | "hours" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`: use ms, s, m or h"
            ))
        }
    };
    if !seconds.is_finite() || !(0.0..=1.0e9).contains(&seconds) {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// [`parse_duration`] for thresholds and timeouts, where zero would make no sense (a stall threshold of zero calls
/// every moment a stall; a timeout of zero gives up before starting): zero is a usage error.
pub fn parse_nonzero_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err(format!(
            "`{text}` is zero, which would fire at once: give a duration above zero, like 500ms, 30s or 2m"
        ));
    }
    Ok(d)
}

/// The start of the `--since` window, in seconds since the epoch: `now` minus a duration (`7d`, `2w`, and what
/// `--stall-after` takes: `24h`, `30m`), or a date (`2026-11-30`, `2026-11-30T08:00:00Z`).
pub fn parse_since(text: &str, now_unix_s: f64) -> Result<f64, String> {
    let t = text.trim();
    if let Some(back) = days_or_weeks(t) {
        return Ok(now_unix_s - back.as_secs_f64());
    }
    if t.starts_with(|c: char| c.is_ascii_digit()) && !t.contains('-') {
        return parse_duration(t)
            .map(|back| now_unix_s - back.as_secs_f64())
            .map_err(|e| {
                format!("--since: {e}; days and weeks work too (7d, 2w), or a date (2026-11-30)")
            });
    }
    let full = if t.len() == 10 {
        format!("{t}T00:00:00Z")
    } else {
        t.to_string()
    };
    full.parse::<crate::WallTime>()
        .ok()
        .and_then(|w| w.to_unix_s())
        .ok_or_else(|| {
            format!("--since {text:?} is neither a time back from now (7d, 24h, 30m) nor a date (2026-11-30 or 2026-11-30T08:00:00Z)")
        })
}

/// `7d`, `2w`, `1.5d`: the units `parse_duration` leaves out (a stall is never days long; a history window is).
fn days_or_weeks(t: &str) -> Option<Duration> {
    let (value, unit) = number_and_unit(t)?;
    let per = match unit {
        "d" | "day" | "days" => 86_400.0,
        "w" | "week" | "weeks" => 7.0 * 86_400.0,
        _ => return None,
    };
    let secs = value * per;
    (secs.is_finite() && (0.0..1.0e10).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

/// Parses a size in bytes for clap (`value_parser = parse_size`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let (value, unit) = number_and_unit(text).ok_or_else(|| {
        format!("`{text}` is not a size: write a number with a unit, like 500M, 1G or 0 (no limit)")
    })?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`: use k, M, G or T"
            ))
        }
    };
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || !(0.0..=u64::MAX as f64 / 2.0).contains(&bytes) {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// The number at the start of `text` and the unit after it (trimmed; empty for a bare number); `None` when there
/// is no number.
fn number_and_unit(text: &str) -> Option<(f64, &str)> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    Some((number.parse().ok()?, unit.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_units_the_spec_names() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn rejects_garbage_with_a_hint() {
        let err = parse_duration("soon").unwrap_err();
        assert!(err.contains("500ms, 30s, 2m or 1h"), "{err}");
        assert!(parse_duration("3d")
            .unwrap_err()
            .contains("unknown unit `d`"));
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn zero_is_refused_where_it_makes_no_sense() {
        for zero in ["0", "0s", "0ms", "0.0m"] {
            let err = parse_nonzero_duration(zero).unwrap_err();
            assert!(err.contains("above zero"), "{zero}: {err}");
            assert_eq!(parse_duration(zero), Ok(Duration::ZERO));
        }
        assert_eq!(parse_nonzero_duration("1ms"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn formats_compactly() {
        use crate::format_duration;
        assert_eq!(format_duration(Duration::from_millis(300)), "300ms");
        assert_eq!(format_duration(Duration::from_secs(2)), "2s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
    }

    const NOW: f64 = 1_796_135_234.0;

    #[test]
    fn since_takes_days_hours_and_dates() {
        assert_eq!(parse_since("7d", NOW), Ok(NOW - 7.0 * 86_400.0));
        assert_eq!(parse_since("2w", NOW), Ok(NOW - 14.0 * 86_400.0));
        assert_eq!(parse_since("24h", NOW), Ok(NOW - 86_400.0));
        assert_eq!(parse_since("30m", NOW), Ok(NOW - 1800.0));
        assert_eq!(parse_since("2026-11-30", NOW), Ok(1_795_996_800.0));
        assert_eq!(
            parse_since("2026-11-30T08:10:00Z", NOW),
            Ok(1_796_026_200.0)
        );
        assert_eq!(
            parse_since("2026-11-30T09:10:00+01:00", NOW),
            parse_since("2026-11-30T08:10:00Z", NOW)
        );
    }

    #[test]
    fn since_refuses_garbage_with_examples() {
        for bad in ["soon", "3y", "2026-13-01", "yesterday"] {
            let err = parse_since(bad, NOW).unwrap_err();
            assert!(
                err.contains("7d") && err.contains("2026-11-30"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn units_are_powers_of_1024() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
    }

    #[test]
    fn nonsense_says_what_to_write() {
        assert!(parse_size("big").unwrap_err().contains("like 500M, 1G"));
        assert!(parse_size("5 parsecs")
            .unwrap_err()
            .contains("unknown unit `parsecs`"));
    }
}
