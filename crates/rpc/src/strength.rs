//! How guessable a job token is: a conservative, deterministic estimate of its entropy and the rule that refuses a
//! weak one, and fresh tokens from the system's random source. Pure but for [`new_token_text`].
//!
//! Why it matters: the coordinator shows the job's public key to any TCP peer before that peer has proven anything
//! (docs/coordinator-protocol.md), and the key is derived from the token and the job id. Whoever can reach the port
//! can therefore try tokens offline, as fast as they can compute HKDF and Ed25519, with no attempt ever seen. Only a
//! token too large to search keeps the link closed, so a weak one is refused before any key is derived from it.

use std::fmt;

/// The least entropy a token must have: beyond any offline search.
pub const MIN_TOKEN_BITS: u32 = 128;

/// The fewest distinct characters a token may have. A random token of the smallest accepted size (32 hex digits)
/// has fewer than this with a probability of about 3 in 10^13; a typed one (`aaaa…`, `abab…`) nearly always does.
pub const MIN_DISTINCT_CHARACTERS: usize = 6;

/// Random bytes in a token that [`new_token_text`] makes: 256 bits, twice [`MIN_TOKEN_BITS`].
pub const NEW_TOKEN_BYTES: usize = 32;

/// The standard alphabets a token's characters are judged against, smallest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alphabet {
    /// `0-9`.
    Decimal,
    /// `0-9a-f`, either case (`openssl rand -hex`, `hangwatch token new`).
    Hex,
    /// RFC 4648 base32, `A-Z2-7`, either case.
    Base32,
    /// RFC 4648 base64, `A-Za-z0-9+/`.
    Base64,
    /// RFC 4648 URL-safe base64, `A-Za-z0-9-_`.
    Base64Url,
    /// Any printable ASCII but space: the 94 characters a token may hold at all.
    Printable,
}

impl Alphabet {
    const ALL: [Alphabet; 6] = [
        Alphabet::Decimal,
        Alphabet::Hex,
        Alphabet::Base32,
        Alphabet::Base64,
        Alphabet::Base64Url,
        Alphabet::Printable,
    ];

    fn covers(self, c: u8) -> bool {
        match self {
            Alphabet::Decimal => c.is_ascii_digit(),
            Alphabet::Hex => c.is_ascii_hexdigit(),
            Alphabet::Base32 => c.is_ascii_alphabetic() || (b'2'..=b'7').contains(&c),
            Alphabet::Base64 => c.is_ascii_alphanumeric() || c == b'+' || c == b'/',
            Alphabet::Base64Url => c.is_ascii_alphanumeric() || c == b'-' || c == b'_',
            Alphabet::Printable => c.is_ascii_graphic(),
        }
    }

    /// log2 of the alphabet's size, in thousandths of a bit, rounded down: integers keep the rule exact.
    fn millibits_per_character(self) -> u64 {
        match self {
            Alphabet::Decimal => 3_321,
            Alphabet::Hex => 4_000,
            Alphabet::Base32 => 5_000,
            Alphabet::Base64 | Alphabet::Base64Url => 6_000,
            Alphabet::Printable => 6_554,
        }
    }
}

impl fmt::Display for Alphabet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Alphabet::Decimal => "decimal",
            Alphabet::Hex => "hex",
            Alphabet::Base32 => "base32",
            Alphabet::Base64 => "base64",
            Alphabet::Base64Url => "URL-safe base64",
            Alphabet::Printable => "printable ASCII",
        })
    }
}

/// What [`token_strength`] found in a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenStrength {
    /// The estimated entropy, in whole bits (rounded down).
    pub bits: u32,
    /// The smallest standard alphabet that covers every counted character.
    pub alphabet: Alphabet,
    /// The characters that count: the token without trailing `=` padding, and only its first repetition when it
    /// repeats itself.
    pub counted: usize,
    /// The characters it has without padding.
    pub length: usize,
    /// How many different characters it holds.
    pub distinct: usize,
}

/// The estimated entropy of `token` (already trimmed), by this rule:
///
/// 1. Trailing `=` (base64 and base32 padding) carries nothing and is dropped.
/// 2. A token that is a shorter string repeated at least twice (`abcabcab`: `abc`) counts only that string.
/// 3. The bits are the counted characters times log2 of the size of the smallest standard alphabet that covers them
///    all: decimal (10), hex (16, either case), base32 (32, either case), base64 or URL-safe base64 (64), printable
///    ASCII (94).
///
/// It assumes every character was drawn at random from that alphabet, so it can only overstate a token a person
/// made up (`job-token-2024` counts as 84 bits): the rule catches the short and the repetitive, and
/// `hangwatch token new` is the way to a good one.
pub fn token_strength(token: &str) -> TokenStrength {
    let bytes = token.trim_end_matches('=').as_bytes();
    let counted = &bytes[..repeating_unit(bytes)];
    let alphabet = Alphabet::ALL
        .into_iter()
        .find(|a| counted.iter().all(|&c| a.covers(c)))
        .unwrap_or(Alphabet::Printable);
    let millibits = counted.len() as u64 * alphabet.millibits_per_character();
    let mut seen = [false; 256];
    for &c in bytes {
        seen[usize::from(c)] = true;
    }
    TokenStrength {
        bits: u32::try_from(millibits / 1000).unwrap_or(u32::MAX),
        alphabet,
        counted: counted.len(),
        length: bytes.len(),
        distinct: seen.iter().filter(|&&s| s).count(),
    }
}

/// The length of the shortest prefix of `bytes` that, repeated at least twice, makes all of it (a last repetition
/// may be cut short); `bytes.len()` when there is none.
fn repeating_unit(bytes: &[u8]) -> usize {
    // Knuth-Morris-Pratt's border table: the longest proper prefix that is also a suffix gives the period.
    let n = bytes.len();
    let mut border = vec![0usize; n];
    let mut k = 0;
    for i in 1..n {
        while k > 0 && bytes[i] != bytes[k] {
            k = border[k - 1];
        }
        if bytes[i] == bytes[k] {
            k += 1;
        }
        border[i] = k;
    }
    let period = n - border.last().copied().unwrap_or(0);
    if period * 2 <= n {
        period
    } else {
        n
    }
}

/// Why a token is too weak to use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Weakness {
    #[error("about {bits} bits of entropy ({counted} characters of {alphabet}{repeats}), at least {MIN_TOKEN_BITS} are needed", repeats = repeats_note(*counted, *length))]
    TooFewBits {
        bits: u32,
        counted: usize,
        length: usize,
        alphabet: Alphabet,
    },
    #[error("it has only {distinct} different characters (at least {MIN_DISTINCT_CHARACTERS} are needed): it repeats itself")]
    Repetitive { distinct: usize },
}

fn repeats_note(counted: usize, length: usize) -> String {
    if counted < length {
        format!(", repeated to make {length}")
    } else {
        String::new()
    }
}

/// The token's strength, or why it is too weak: fewer than [`MIN_TOKEN_BITS`] by [`token_strength`]'s rule, or
/// fewer than [`MIN_DISTINCT_CHARACTERS`] different characters.
pub fn check_token_strength(token: &str) -> Result<TokenStrength, Weakness> {
    let strength = token_strength(token);
    if strength.bits < MIN_TOKEN_BITS {
        return Err(Weakness::TooFewBits {
            bits: strength.bits,
            counted: strength.counted,
            length: strength.length,
            alphabet: strength.alphabet,
        });
    }
    if strength.distinct < MIN_DISTINCT_CHARACTERS {
        return Err(Weakness::Repetitive {
            distinct: strength.distinct,
        });
    }
    Ok(strength)
}

/// The system's random source could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the system's random source (getrandom)")]
pub struct NoRandomness;

/// A fresh token: [`NEW_TOKEN_BYTES`] bytes from the kernel's random source (getrandom(2), through ring's
/// `SystemRandom`), as lowercase hex (64 characters, 256 bits by [`token_strength`]'s rule).
pub fn new_token_text() -> Result<String, NoRandomness> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; NEW_TOKEN_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| NoRandomness)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 32 hex digits from a random source (fixed here so the test is deterministic).
    const HEX_128: &str = "3f9a0c7e5b21d84c6e0f1a9b7d3c2e58";

    #[test]
    fn a_short_token_is_refused_with_its_bits() {
        let err = check_token_strength("abc").unwrap_err();
        assert_eq!(
            err,
            Weakness::TooFewBits {
                bits: 12,
                counted: 3,
                length: 3,
                alphabet: Alphabet::Hex
            }
        );
        assert_eq!(
            err.to_string(),
            "about 12 bits of entropy (3 characters of hex), at least 128 are needed"
        );
    }

    #[test]
    fn thirty_two_hex_digits_are_exactly_enough_and_one_fewer_is_not() {
        let strength = check_token_strength(HEX_128).expect("128 bits");
        assert_eq!((strength.bits, strength.alphabet), (128, Alphabet::Hex));
        assert_eq!(
            check_token_strength(&HEX_128.to_uppercase()).map(|s| s.bits),
            Ok(128),
            "hex in upper case is still hex"
        );
        assert!(matches!(
            check_token_strength(&HEX_128[1..]),
            Err(Weakness::TooFewBits { bits: 124, .. })
        ));
    }

    #[test]
    fn a_fresh_token_is_256_bits_of_hex_and_never_the_same() {
        let a = new_token_text().expect("random");
        let b = new_token_text().expect("random");
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        let strength = check_token_strength(&a).expect("accepted");
        assert_eq!((strength.bits, strength.alphabet), (256, Alphabet::Hex));
    }

    #[test]
    fn one_character_repeated_is_refused_at_any_length() {
        for n in [1, 32, 64, 1000, 10_000] {
            let token = "a".repeat(n);
            let err = check_token_strength(&token).unwrap_err();
            assert!(
                matches!(
                    err,
                    Weakness::TooFewBits {
                        bits: 4,
                        counted: 1,
                        ..
                    }
                ),
                "{n}: {err:?}"
            );
            if n > 1 {
                assert!(err.to_string().contains("repeated to make"), "{err}");
            }
        }
    }

    #[test]
    fn a_repeated_pattern_counts_once_and_few_distinct_characters_are_refused() {
        let twice = format!("{HEX_128}{HEX_128}");
        assert_eq!(token_strength(&twice).bits, 128, "one repetition counted");
        let cut = format!("{HEX_128}{}", &HEX_128[..10]);
        assert_eq!(
            token_strength(&cut).counted,
            42,
            "a repetition shorter than the unit is not periodic"
        );
        let abab = "ab".repeat(40);
        assert_eq!(token_strength(&abab).counted, 2);
        let mostly_a = format!("{}bcde", "a".repeat(60));
        assert_eq!(
            check_token_strength(&mostly_a),
            Err(Weakness::Repetitive { distinct: 5 })
        );
        assert!(
            matches!(
                check_token_strength("0123456789abcdef0123456789abcdef"),
                Err(Weakness::TooFewBits {
                    bits: 64,
                    counted: 16,
                    length: 32,
                    ..
                })
            ),
            "a sequence typed twice is 16 characters"
        );
    }

    #[test]
    fn the_smallest_alphabet_that_covers_the_token_is_the_one_counted() {
        let cases = [
            ("0123456789", Alphabet::Decimal),
            ("deadBEEF", Alphabet::Hex),
            ("MFRGGZDFMZTWQ2LK", Alphabet::Base32),
            ("mfrggzdfmztwq2lk", Alphabet::Base32),
            ("ab+/Zz09", Alphabet::Base64),
            ("ab-_Zz09", Alphabet::Base64Url),
            ("ab+_Zz09", Alphabet::Printable),
            ("p@ss!word", Alphabet::Printable),
        ];
        for (token, alphabet) in cases {
            assert_eq!(token_strength(token).alphabet, alphabet, "{token}");
        }
        let padded = "q3Vh8mZp0Lr2Kx7NsWd4Yf1Tj9Bc6Ge5Ua==";
        assert_eq!(token_strength(padded).counted, padded.len() - 2);
        assert_eq!(token_strength(padded).alphabet, Alphabet::Base64);
        assert_eq!(token_strength("====").bits, 0);
    }
}
