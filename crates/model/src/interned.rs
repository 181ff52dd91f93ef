//! Shared strings for the texts that repeat across ranks (a Python frame's file and function): one copy per thread
//! that decodes them, not one per frame.
//!
//! A coordinator of 1,250 nodes x 8 ranks decodes about 250,000 frames per roll call, nearly all naming the same
//! few hundred files and functions: as separate `String`s they were about 40 MB of its peak memory.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde::de::{self, Deserializer, Visitor};

/// At most this many texts are remembered per decoding thread; then the memory is forgotten (the texts themselves
/// live on in the frames that use them), so a long-lived decoder never grows without bound.
const REMEMBERED: usize = 16_384;

thread_local! {
    static SEEN: RefCell<HashSet<Arc<str>>> = RefCell::new(HashSet::new());
}

/// `text` as a shared string, the same allocation as an equal text this thread decoded before.
pub fn intern(text: &str) -> Arc<str> {
    SEEN.with(|seen| {
        let mut seen = seen.borrow_mut();
        if let Some(shared) = seen.get(text) {
            return Arc::clone(shared);
        }
        if seen.len() >= REMEMBERED {
            seen.clear();
        }
        let shared: Arc<str> = Arc::from(text);
        seen.insert(Arc::clone(&shared));
        shared
    })
}

/// `#[serde(deserialize_with = "...")]` for an `Arc<str>` field whose texts repeat.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
    struct Text;
    impl Visitor<'_> for Text {
        type Value = Arc<str>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Arc<str>, E> {
            Ok(intern(v))
        }
    }
    d.deserialize_str(Text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_decoded_on_one_thread_share_one_allocation() {
        let a = intern("/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d.py");
        let b = intern(&String::from(
            "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d.py",
        ));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &intern("train.py")));
    }

    #[test]
    fn frames_decoded_from_json_share_their_file_names_and_encode_as_plain_strings() {
        let json = r#"[{"function":"barrier","filename":"/x/c10d.py","line":1},
                       {"function":"wait","filename":"/x/c10d.py","line":2}]"#;
        let frames: Vec<crate::PythonFrame> = serde_json::from_str(json).expect("frames");
        assert!(Arc::ptr_eq(&frames[0].filename, &frames[1].filename));
        assert_eq!(&*frames[1].function, "wait");
        let again = serde_json::to_value(&frames[0]).expect("encode");
        assert_eq!(again["filename"], "/x/c10d.py");
    }

    #[test]
    fn the_memory_of_texts_is_bounded_and_forgetting_loses_no_text() {
        let first = intern("first");
        for i in 0..REMEMBERED + 10 {
            intern(&format!("text {i}"));
        }
        SEEN.with(|seen| assert!(seen.borrow().len() <= REMEMBERED));
        assert_eq!(&*first, "first");
    }
}
