//! How an error is put into words on one line: the error and each of its causes, for log messages and for the
//! messages helper children send back to hangwatch.

/// `what failed: why: the cause of that`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_cause_is_named_in_order() {
        let outer = Wrapped(std::io::Error::other("disk full"));
        assert_eq!(
            super::error_chain(&outer),
            "cannot write the log: disk full"
        );
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("cannot write the log")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}
