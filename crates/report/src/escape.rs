//! HTML escaping: the one way every text from the bundle reaches the page (and the timeline's SVG).

use std::fmt;

/// Text escaped for HTML element content and quoted attribute values.
///
/// Hand-written rather than a crate: it is five characters, and every string the page shows goes through this
/// one function, which the tests check with hostile input.
pub struct Esc<'a>(pub &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

/// `text` escaped (see `Esc`).
pub fn escape(text: &str) -> String {
    Esc(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_the_five_characters_and_leaves_the_rest() {
        assert_eq!(
            escape(r#"<script>alert(1)</script> "a" 'b' & c — ü"#),
            "&lt;script&gt;alert(1)&lt;/script&gt; &quot;a&quot; &#39;b&#39; &amp; c — ü"
        );
        assert_eq!(escape(""), "");
        assert_eq!(escape("plain"), "plain");
    }
}
