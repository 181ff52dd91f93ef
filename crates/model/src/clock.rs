//! The wall clock in the unit of every `*_unix_s` field: seconds since the Unix epoch, as `f64`.

/// Now, in seconds since the Unix epoch (0 if the clock is before 1970).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
