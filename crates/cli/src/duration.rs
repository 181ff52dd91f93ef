//! Durations on the command line: `500ms`, `30s`, `2m`, `1h`, `1.5s`; a bare number means seconds.

use std::time::Duration;

/// Parses a duration for clap (`value_parser = parse_duration`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| {
        format!("`{text}` is not a duration: write a number with a unit, like 500ms, 30s, 2m or 1h")
    })?;
    let seconds = match unit.trim() {
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

pub use hangwatch_model::format_duration;

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
        assert_eq!(format_duration(Duration::from_millis(300)), "300ms");
        assert_eq!(format_duration(Duration::from_secs(2)), "2s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
    }
}
