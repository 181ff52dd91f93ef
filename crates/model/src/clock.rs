//! Civil time and durations for people: the wall clock in the unit of every `*_unix_s` field (seconds since the
//! Unix epoch, as `f64`), those times as UTC dates ([`utc_time`]), the civil date and time a log printed
//! ([`WallTime`], the one civil-time arithmetic and formatting hangwatch has), and durations ([`format_duration`],
//! [`format_limit`], [`duration_text`], [`coarse_duration_text`]: one place, four forms that callers print).

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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

/// `20261129T214500Z`: a UTC time in names (run directories), sorting as it reads; the raw seconds when out of range.
pub fn utc_stamp(unix_s: u64) -> String {
    WallTime::from_unix_utc(unix_s as f64)
        .map(|w| {
            format!(
                "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
                w.year.unwrap_or_default(),
                w.month,
                w.day,
                w.hour,
                w.minute,
                w.second
            )
        })
        .unwrap_or_else(|| format!("{unix_s}s"))
}

/// `2026-11-29T21:45:00.5Z` (RFC 3339, UTC, the fraction only when there is one), as Alertmanager wants its
/// times; the epoch when out of range.
pub fn rfc3339(unix_s: f64) -> String {
    WallTime::from_unix_utc(unix_s)
        .map(|w| {
            let whole = WallTime {
                micros: None,
                offset_minutes: None,
                ..w
            };
            let fraction = match w.micros {
                Some(us) if us > 0 => format!(".{us:06}").trim_end_matches('0').to_string(),
                _ => String::new(),
            };
            format!("{whole}{fraction}Z")
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// `1.5s`, `300ms`, `2m`: the shortest honest rendering, for messages and logs (near-whole seconds read as whole).
/// The other forms: [`format_limit`] (exact), [`duration_text`] (reports), [`coarse_duration_text`] (settings).
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

/// `2s`, `500ms`, `1.5s`, `3m`: a limit as it was set (probe deadlines); unlike [`format_duration`], whole
/// seconds only when exact (`1.0s` for 1020 ms).
pub fn format_limit(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if (ms / 1000) * 1000 == ms && ms < 120_000 {
        format!("{}s", ms / 1000)
    } else if ms < 120_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{}m", d.as_secs() / 60)
    }
}

/// Seconds for people reading a report: `850 ms`, `4.9 s`, `3 min 20 s`, `2 h 5 min` (negative reads as 0). The
/// compact form of messages is [`format_duration`].
pub fn duration_text(secs: f64) -> String {
    let secs = secs.max(0.0);
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1000.0)
    } else if secs < 60.0 {
        format!("{secs:.1} s")
    } else if secs < 3600.0 {
        format!("{} min {} s", (secs / 60.0) as u64, (secs % 60.0) as u64)
    } else {
        format!(
            "{} h {} min",
            (secs / 3600.0) as u64,
            ((secs % 3600.0) / 60.0) as u64
        )
    }
}

/// `90 s`, `30 min`, `2 h`, `2 h 5 min`: whole seconds as coarse as a setting is read (the kernel's hung-task
/// timeout, in `hangwatch doctor`); [`duration_text`] is the finer form of reports.
pub fn coarse_duration_text(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 2 * 3600 => format!("{} min", s / 60),
        s if s % 3600 / 60 == 0 => format!("{} h", s / 3600),
        s => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

/// A civil date and time as a log printed it. Serialized as ISO 8601 text: `2023-03-04T04:10:52`, with
/// `.123456` when sub-second digits were printed, `Z`/`+01:00` when an offset was printed, and the truncated
/// form `--03-04T04:10:52` when the log did not print a year (classic syslog).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WallTime {
    pub year: Option<i32>,
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
    /// Microseconds, when the log printed them.
    pub micros: Option<u32>,
    /// Offset from UTC in minutes, when the log printed one.
    pub offset_minutes: Option<i32>,
}

/// Year used for calendar arithmetic when the log has none: a leap year, so that 29 February stays valid.
const YEARLESS: i32 = 2000;

impl WallTime {
    /// Validates the fields; `None` for impossible dates and times.
    pub fn new(
        year: Option<i32>,
        month: u8,
        day: u8,
        hour: u8,
        minute: u8,
        second: u8,
    ) -> Option<WallTime> {
        let y = year.unwrap_or(YEARLESS);
        if !(1..=12).contains(&month)
            || day == 0
            || day > days_in_month(y, month)
            || hour > 23
            || minute > 59
            || second > 60
            || !(0..=9999).contains(&y)
        {
            return None;
        }
        Some(WallTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
            micros: None,
            offset_minutes: None,
        })
    }

    /// Seconds since 1970-01-01 of this time read as if it were UTC (offset ignored); the basis of arithmetic.
    pub(crate) fn naive_seconds(&self) -> i64 {
        let days = days_from_civil(self.year.unwrap_or(YEARLESS), self.month, self.day);
        days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second.min(59))
    }

    fn from_naive_seconds(secs: i64, template: &WallTime) -> WallTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        WallTime {
            year: template.year.map(|_| y),
            month: m,
            day: d,
            hour: (rem / 3600) as u8,
            minute: (rem % 3600 / 60) as u8,
            second: (rem % 60) as u8,
            micros: template.micros,
            offset_minutes: template.offset_minutes,
        }
    }

    pub fn minus_secs(&self, secs: u64) -> WallTime {
        let secs = i64::try_from(secs).unwrap_or(i64::MAX / 2);
        WallTime::from_naive_seconds(self.naive_seconds().saturating_sub(secs), self)
    }

    /// UTC civil time of a Unix timestamp; `None` outside years 0..=9999.
    pub fn from_unix_utc(unix_s: f64) -> Option<WallTime> {
        if !unix_s.is_finite() || !(-62_000_000_000.0..=253_000_000_000.0).contains(&unix_s) {
            return None;
        }
        let whole = unix_s.floor() as i64;
        let micros = ((unix_s - whole as f64) * 1e6).round().min(999_999.0) as u32;
        let template = WallTime {
            year: Some(1970),
            month: 1,
            day: 1,
            hour: 0,
            minute: 0,
            second: 0,
            micros: Some(micros),
            offset_minutes: Some(0),
        };
        Some(WallTime::from_naive_seconds(whole, &template))
    }

    /// Seconds since the Unix epoch; a time printed without an offset is taken as UTC. `None` without a year.
    pub fn to_unix_s(&self) -> Option<f64> {
        self.year?;
        let offset_s = i64::from(self.offset_minutes.unwrap_or(0)) * 60;
        let micros = f64::from(self.micros.unwrap_or(0)) / 1e6;
        Some((self.naive_seconds() - offset_s) as f64 + micros)
    }

    /// Orders two times by their printed fields; a missing year takes the other's year.
    pub fn cmp_fields(&self, other: &WallTime) -> Ordering {
        let year_a = self.year.or(other.year).unwrap_or(YEARLESS);
        let year_b = other.year.or(self.year).unwrap_or(YEARLESS);
        (
            year_a,
            self.month,
            self.day,
            self.hour,
            self.minute,
            self.second,
            self.micros.unwrap_or(0),
        )
            .cmp(&(
                year_b,
                other.month,
                other.day,
                other.hour,
                other.minute,
                other.second,
                other.micros.unwrap_or(0),
            ))
    }

    pub fn same_day(&self, other: &WallTime) -> bool {
        self.month == other.month
            && self.day == other.day
            && (self.year.is_none() || other.year.is_none() || self.year == other.year)
    }

    /// `04:10:52`
    pub fn clock(&self) -> String {
        format!("{:02}:{:02}:{:02}", self.hour, self.minute, self.second)
    }

    /// `2023-03-04` (or `03-04` without a year).
    pub fn date(&self) -> String {
        match self.year {
            Some(y) => format!("{y:04}-{:02}-{:02}", self.month, self.day),
            None => format!("{:02}-{:02}", self.month, self.day),
        }
    }

    /// `04:10:52` when on the same day as `reference`, else `2023-03-02 15:57:56`; `UTC` appended for UTC times.
    pub fn human(&self, reference: Option<&WallTime>) -> String {
        let mut text = match reference {
            Some(r) if self.same_day(r) => self.clock(),
            _ => format!("{} {}", self.date(), self.clock()),
        };
        if self.offset_minutes == Some(0) {
            text.push_str(" UTC");
        }
        text
    }
}

impl fmt::Display for WallTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.year {
            Some(y) => write!(f, "{y:04}-")?,
            None => f.write_str("--")?,
        }
        write!(
            f,
            "{:02}-{:02}T{:02}:{:02}:{:02}",
            self.month, self.day, self.hour, self.minute, self.second
        )?;
        if let Some(us) = self.micros {
            write!(f, ".{us:06}")?;
        }
        match self.offset_minutes {
            Some(0) => f.write_str("Z"),
            Some(off) => {
                let sign = if off < 0 { '-' } else { '+' };
                write!(f, "{sign}{:02}:{:02}", off.abs() / 60, off.abs() % 60)
            }
            None => Ok(()),
        }
    }
}

/// Why a text is not a wall-clock time in our ISO form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a date and time like 2023-03-04T04:10:52: {text:?}")]
pub struct WallTimeParseError {
    pub text: String,
}

impl FromStr for WallTime {
    type Err = WallTimeParseError;

    /// Reads what `Display` writes, and also `2023-03-04 04:10[:52]`, `,` as decimal separator and `+0100`
    /// offsets (journalctl), so that users can type `--since` values.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_iso(s.trim())
            .and_then(|(w, rest)| rest.is_empty().then_some(w))
            .ok_or_else(|| WallTimeParseError {
                text: s.to_string(),
            })
    }
}

impl Serialize for WallTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for WallTime {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Parses an ISO 8601 date-time at the start of `s`; returns it and the unparsed rest.
/// Accepts `T` or one space between date and time, optional seconds, `.`/`,` fractions, `Z`, `+hh:mm`, `+hhmm`,
/// and the yearless `--MM-DD` form.
pub fn parse_iso(s: &str) -> Option<(WallTime, &str)> {
    let b = s.as_bytes();
    let (year, mut i) = if b.starts_with(b"--") {
        (None, 2)
    } else if b.get(4) == Some(&b'-') {
        (Some(digits(b, 0, 4)? as i32), 5)
    } else {
        return None;
    };
    let month = digits(b, i, 2)? as u8;
    if b.get(i + 2) != Some(&b'-') {
        return None;
    }
    i += 3;
    let day = digits(b, i, 2)? as u8;
    i += 2;
    if !matches!(b.get(i), Some(b'T') | Some(b' ')) {
        return None;
    }
    i += 1;
    let hour = digits(b, i, 2)? as u8;
    if b.get(i + 2) != Some(&b':') {
        return None;
    }
    i += 3;
    let minute = digits(b, i, 2)? as u8;
    i += 2;
    let mut second = 0;
    if b.get(i) == Some(&b':') {
        second = digits(b, i + 1, 2)? as u8;
        i += 3;
    }
    let mut wall = WallTime::new(year, month, day, hour, minute, second)?;
    if matches!(b.get(i), Some(b'.') | Some(b',')) && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let frac = &s[start..i];
        let mut micros: u32 = 0;
        for (n, c) in frac.bytes().take(6).enumerate() {
            micros += u32::from(c - b'0') * 10u32.pow(5 - n as u32);
        }
        wall.micros = Some(micros);
    }
    match b.get(i) {
        Some(b'Z') => {
            wall.offset_minutes = Some(0);
            i += 1;
        }
        Some(&sign @ (b'+' | b'-')) => {
            let hh = digits(b, i + 1, 2)?;
            let (mm, len) = if b.get(i + 3) == Some(&b':') {
                (digits(b, i + 4, 2)?, 6)
            } else {
                (digits(b, i + 3, 2)?, 5)
            };
            let off = (hh * 60 + mm) as i32;
            wall.offset_minutes = Some(if sign == b'-' { -off } else { off });
            i += len;
        }
        _ => {}
    }
    Some((wall, &s[i..]))
}

/// `len` ASCII digits at `at`, as a number.
fn digits(b: &[u8], at: usize, len: usize) -> Option<u32> {
    let slice = b.get(at..at + len)?;
    slice.iter().try_fold(0u32, |acc, c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

/// Julian day number of 1970-01-01: `time` counts days that way.
const UNIX_EPOCH_JULIAN_DAY: i64 = 2_440_588;

/// The calendar date, if it exists (the `time` crate knows the calendar; no hand-written copy of it here).
fn date(y: i32, m: u8, d: u8) -> Option<time::Date> {
    time::Date::from_calendar_date(y, time::Month::try_from(m).ok()?, d).ok()
}

fn days_in_month(y: i32, m: u8) -> u8 {
    match time::Month::try_from(m) {
        Ok(month) => time::util::days_in_month(month, y),
        Err(_) => 0,
    }
}

/// Days since 1970-01-01 of a date that [`WallTime::new`] validated (0 for one that does not exist).
fn days_from_civil(y: i32, m: u8, d: u8) -> i64 {
    date(y, m, d).map_or(0, |date| {
        i64::from(date.to_julian_day()) - UNIX_EPOCH_JULIAN_DAY
    })
}

/// The date `z` days after 1970-01-01 (1970-01-01 itself when out of the calendar's range).
fn civil_from_days(z: i64) -> (i32, u8, u8) {
    let day = i32::try_from(z + UNIX_EPOCH_JULIAN_DAY)
        .ok()
        .and_then(|jd| time::Date::from_julian_day(jd).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH.date());
    (day.year(), u8::from(day.month()), day.day())
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_and_rfc3339_are_the_same_civil_time_in_other_forms() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(1_795_988_366), "20261129T213926Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(rfc3339(1_795_988_366.0), "2026-11-29T21:39:26Z");
        assert_eq!(rfc3339(1_795_988_366.25), "2026-11-29T21:39:26.25Z");
        assert_eq!(utc_time(1_795_988_366.9), "2026-11-29 21:39:26 UTC");
    }

    #[test]
    fn compact_durations_for_messages() {
        use std::time::Duration;
        assert_eq!(format_duration(Duration::from_millis(300)), "300ms");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_millis(2020)), "2s");
        assert_eq!(format_duration(Duration::from_secs(300)), "5m");
    }

    #[test]
    fn limits_read_as_set() {
        use std::time::Duration;
        assert_eq!(format_limit(Duration::from_millis(500)), "500ms");
        assert_eq!(format_limit(Duration::from_secs(2)), "2s");
        assert_eq!(format_limit(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_limit(Duration::from_millis(2020)), "2.0s");
        assert_eq!(format_limit(Duration::from_secs(300)), "5m");
    }

    #[test]
    fn coarse_durations_read_well() {
        assert_eq!(coarse_duration_text(90), "90 s");
        assert_eq!(coarse_duration_text(1800), "30 min");
        assert_eq!(coarse_duration_text(7200), "2 h");
        assert_eq!(coarse_duration_text(7500), "2 h 5 min");
    }

    #[test]
    fn report_durations_read_well() {
        assert_eq!(duration_text(0.25), "250 ms");
        assert_eq!(duration_text(4.86), "4.9 s");
        assert_eq!(duration_text(200.0), "3 min 20 s");
        assert_eq!(duration_text(7500.0), "2 h 5 min");
        assert_eq!(duration_text(-1.0), "0 ms");
    }

    #[test]
    fn utc_times_read_as_dates() {
        assert_eq!(utc_time(1_796_135_234.227_888), "2026-12-01 14:27:14 UTC");
        assert_eq!(utc_time(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_time(f64::NAN), "NaNs since 1970");
    }

    fn wall(s: &str) -> WallTime {
        s.parse().unwrap()
    }

    #[test]
    fn subtracting_crosses_midnight_and_month_ends() {
        assert_eq!(
            wall("2023-03-04T04:10:52").minus_secs(120).to_string(),
            "2023-03-04T04:08:52"
        );
        assert_eq!(
            wall("2023-03-01T00:01:00").minus_secs(120).to_string(),
            "2023-02-28T23:59:00"
        );
        assert_eq!(
            wall("2024-03-01T00:01:00").minus_secs(120).to_string(),
            "2024-02-29T23:59:00"
        );
        assert_eq!(
            wall("--01-01T00:00:30").minus_secs(60).to_string(),
            "--12-31T23:59:30"
        );
    }

    #[test]
    fn iso_forms_round_trip() {
        for text in [
            "2023-03-04T04:10:52",
            "2023-03-04T04:10:52.123456+01:00",
            "--06-26T12:23:15",
            "2023-03-04T04:10:52Z",
        ] {
            assert_eq!(wall(text).to_string(), text);
        }
        assert_eq!(wall("2023-03-04 04:10").to_string(), "2023-03-04T04:10:00");
        assert_eq!(
            wall("2023-03-04T04:10:52,5+0100").to_string(),
            "2023-03-04T04:10:52.500000+01:00"
        );
        assert!("2023-02-30T00:00:00".parse::<WallTime>().is_err());
        assert!("2023-03-04T04:10:52 trailing".parse::<WallTime>().is_err());
    }

    #[test]
    fn unix_time_converts_to_utc() {
        assert_eq!(
            WallTime::from_unix_utc(1_677_903_052.0)
                .unwrap()
                .to_string(),
            "2023-03-04T04:10:52.000000Z"
        );
        assert_eq!(
            WallTime::from_unix_utc(-1.0).unwrap().to_string(),
            "1969-12-31T23:59:59.000000Z"
        );
    }

    #[test]
    fn times_convert_back_to_unix_time() {
        assert_eq!(
            wall("2023-03-04T04:10:52Z").to_unix_s(),
            Some(1_677_903_052.0)
        );
        assert_eq!(
            wall("2023-03-04T05:10:52+01:00").to_unix_s(),
            Some(1_677_903_052.0)
        );
        assert_eq!(
            wall("2023-03-04T04:10:52.5").to_unix_s(),
            Some(1_677_903_052.5)
        );
        assert_eq!(wall("--03-04T04:10:52").to_unix_s(), None);
    }

    #[test]
    fn yearless_times_compare_with_the_other_year() {
        assert_eq!(
            wall("--03-04T04:10:52").cmp_fields(&wall("2023-03-04T04:00:00")),
            Ordering::Greater
        );
        assert_eq!(
            wall("2023-03-04T04:10:52").cmp_fields(&wall("2023-03-04T04:10:52")),
            Ordering::Equal
        );
    }

    #[test]
    fn human_time_omits_the_date_on_the_reference_day() {
        let t = wall("2023-03-04T04:08:52");
        assert_eq!(t.human(Some(&wall("2023-03-04T04:27:15"))), "04:08:52");
        assert_eq!(
            t.human(Some(&wall("2023-03-05T00:00:00"))),
            "2023-03-04 04:08:52"
        );
        assert_eq!(t.human(None), "2023-03-04 04:08:52");
    }
}
