//! Durations for people ([`format_duration`]), and the wall clock in the unit of every `*_unix_s` field (seconds since the Unix epoch, as `f64`), and those times
//! for people: UTC, in the one civil-time formatting hangwatch has ([`hangwatch_kmsg::WallTime`]).

use hangwatch_kmsg::WallTime;

/// Now, in seconds since the Unix epoch (0 if the clock is before 1970).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `2026-12-01 14:27:14 UTC`; the raw number of seconds when out of the calendar's range.
pub fn utc_time(unix_s: f64) -> String {
    WallTime::from_unix_utc(unix_s.floor())
        .map(|w| {
            let whole = WallTime { micros: None, ..w };
            whole.human(None)
        })
        .unwrap_or_else(|| format!("{unix_s}s since 1970"))
}

/// `1.5s`, `300ms`, `2m`: the shortest honest rendering, for messages.
pub fn format_duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 120_000 {
        let s = d.as_secs_f64();
        if (s - s.round()).abs() < 0.05 {
            format!("{}s", s.round())
        } else {
            format!("{s:.1}s")
        }
    } else {
        format!("{}m", d.as_secs() / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_read_as_dates() {
        assert_eq!(utc_time(1_796_135_234.227_888), "2026-12-01 14:27:14 UTC");
        assert_eq!(utc_time(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_time(f64::NAN), "NaNs since 1970");
    }
}
