//! How sizes and times appear in the sink's messages to people (`3.2 MiB`, `2026-12-01 06:40:12 UTC`).

use std::time::{SystemTime, UNIX_EPOCH};

/// `512 B`, `64.0 KiB`, `3.2 MiB`, `1.0 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `2026-12-01 06:40:12 UTC` (to the second; a time before 1970 prints as the epoch).
pub fn utc_time(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    hangwatch_model::utc_time(secs as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sizes_read_like_df() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(64 << 10), "64.0 KiB");
        assert_eq!(human_bytes(3_355_443), "3.2 MiB");
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
    }

    #[test]
    fn times_are_calendar_dates_in_utc() {
        assert_eq!(utc_time(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_988_366);
        assert_eq!(utc_time(t), "2026-11-29 21:39:26 UTC");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc_time(leap), "2000-02-29 00:00:00 UTC");
    }
}
