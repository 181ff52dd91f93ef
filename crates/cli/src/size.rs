//! Sizes on the command line: `1G`, `512M`, `64k`, `1.5GiB`, a bare number of bytes; powers of 1024.

/// Parses a size in bytes for clap (`value_parser = parse_size`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| {
        format!("`{text}` is not a size: write a number with a unit, like 500M, 1G or 0 (no limit)")
    })?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
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

#[cfg(test)]
mod tests {
    use super::*;

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
