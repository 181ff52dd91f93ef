//! The shape of a pickle, found before it is decoded: how deeply its containers nest and how many containers it
//! expands to, by a walk of its opcodes that builds only the graph of containers (no values). A job's own Flight
//! Recorder dump is a file anyone who can write there controls; serde-pickle builds, resolves, hands to serde and
//! drops values recursively, so 2 MB of nested lists would overflow the decoding thread's stack, and a few shared
//! references (`l1 = [l0, l0]; l2 = [l1, l1]` ...) expand to billions of values. The walk itself never recurses
//! and costs one pass over the opcodes plus one over the graph.
//!
//! The graph only grows (nothing taken off the stack or out of the memo is forgotten), so its depth bounds every
//! value the decoder ever holds, including ones popped and dropped before the end. A structure that contains
//! itself is refused too.

use std::collections::HashMap;

/// Containers nested deeper than this are refused: a torch dump nests about 6 deep (the dump, its entries, an
/// entry, its frames, a frame).
pub const MAX_DEPTH: usize = 64;
/// Containers a pickle may expand to once shared references are copied out (a dump of 2,000 entries with their
/// frames has about 100,000).
pub const MAX_EXPANDED: u64 = 4_000_000;
/// Containers a pickle may create at all (each costs the walk a little memory).
const MAX_CONTAINERS: usize = 8_000_000;

/// Why a pickle's shape is refused (or could not be read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("the pickle nests containers more than {MAX_DEPTH} deep: not decoded")]
    TooDeep,
    #[error("the pickle expands to more than {MAX_EXPANDED} containers: not decoded")]
    TooLarge,
    #[error("the pickle contains itself: not decoded")]
    Recursive,
    #[error("not a pickle: {what} at byte {at}")]
    Malformed { what: &'static str, at: usize },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Item {
    Mark,
    Scalar,
    Container(u32),
}

struct Walk<'a> {
    bytes: &'a [u8],
    at: usize,
    stack: Vec<Item>,
    memo: HashMap<u64, Item>,
    /// The containers each container holds.
    children: Vec<Vec<u32>>,
}

/// Checks that `pickle` nests at most [`MAX_DEPTH`] deep and expands to at most [`MAX_EXPANDED`] containers.
pub fn check(pickle: &[u8]) -> Result<(), ShapeError> {
    let mut walk = Walk {
        bytes: pickle,
        at: 0,
        stack: Vec::new(),
        memo: HashMap::new(),
        children: Vec::new(),
    };
    walk.run()?;
    measure(&walk.children)
}

impl Walk<'_> {
    fn bad(&self, what: &'static str) -> ShapeError {
        ShapeError::Malformed { what, at: self.at }
    }

    fn take(&mut self, n: u64) -> Result<&[u8], ShapeError> {
        let n = usize::try_from(n).map_err(|_| self.bad("a length past the end"))?;
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| self.bad("a length past the end"))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn number(&mut self, width: u64) -> Result<u64, ShapeError> {
        let bytes = self.take(width)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0u64, |n, &b| (n << 8) | u64::from(b)))
    }

    fn line(&mut self) -> Result<&[u8], ShapeError> {
        let rest = &self.bytes[self.at..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.bad("a line without its end"))?;
        self.at += end + 1;
        Ok(&rest[..end])
    }

    fn pop(&mut self) -> Result<Item, ShapeError> {
        match self.stack.pop() {
            Some(Item::Mark) | None => Err(self.bad("an operation on an empty stack")),
            Some(item) => Ok(item),
        }
    }

    /// The items above the topmost mark, the mark removed.
    fn pop_to_mark(&mut self) -> Result<Vec<Item>, ShapeError> {
        let mark = self
            .stack
            .iter()
            .rposition(|i| *i == Item::Mark)
            .ok_or_else(|| self.bad("no mark"))?;
        let items = self.stack.split_off(mark + 1);
        self.stack.pop();
        Ok(items)
    }

    fn new_container(&mut self, items: &[Item]) -> Result<Item, ShapeError> {
        if self.children.len() >= MAX_CONTAINERS {
            return Err(ShapeError::TooLarge);
        }
        let id = u32::try_from(self.children.len()).map_err(|_| ShapeError::TooLarge)?;
        self.children.push(Vec::new());
        let item = Item::Container(id);
        self.add_to(item, items)?;
        Ok(item)
    }

    fn add_to(&mut self, target: Item, items: &[Item]) -> Result<(), ShapeError> {
        let Item::Container(id) = target else {
            return Err(self.bad("adding to something that is not a container"));
        };
        for item in items {
            match item {
                Item::Container(child) => self.children[id as usize].push(*child),
                Item::Scalar => {}
                Item::Mark => return Err(self.bad("a mark inside a container")),
            }
        }
        Ok(())
    }

    fn top(&self) -> Result<Item, ShapeError> {
        match self.stack.last() {
            Some(Item::Mark) | None => Err(self.bad("an operation on an empty stack")),
            Some(item) => Ok(*item),
        }
    }

    fn memo_get(&mut self, key: u64) -> Result<(), ShapeError> {
        let item = *self
            .memo
            .get(&key)
            .ok_or_else(|| self.bad("a memo entry never put"))?;
        self.stack.push(item);
        Ok(())
    }

    fn memo_put(&mut self, key: u64) -> Result<(), ShapeError> {
        let top = self.top()?;
        self.memo.insert(key, top);
        Ok(())
    }

    fn decimal_line(&mut self) -> Result<u64, ShapeError> {
        let line = self.line()?;
        let text = std::str::from_utf8(line).ok();
        text.and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| self.bad("a memo key that is not a number"))
    }

    fn run(&mut self) -> Result<(), ShapeError> {
        loop {
            let Some(&op) = self.bytes.get(self.at) else {
                return Err(self.bad("the end before STOP"));
            };
            self.at += 1;
            match op {
                b'.' => return Ok(()),
                b'(' => self.stack.push(Item::Mark),
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_to_mark()?;
                }
                b'2' => {
                    let top = self.top()?;
                    self.stack.push(top);
                }
                // Scalars written as text, or by length.
                b'F' | b'I' | b'L' | b'S' | b'V' | b'P' => {
                    self.line()?;
                    self.stack.push(Item::Scalar);
                }
                b'c' => {
                    self.line()?;
                    self.line()?;
                    self.stack.push(Item::Scalar);
                }
                b'N' | 0x88 | 0x89 | 0x97 => self.stack.push(Item::Scalar),
                b'K' | 0x82 => self.scalar_of(1)?,
                b'M' | 0x83 => self.scalar_of(2)?,
                b'J' | 0x84 => self.scalar_of(4)?,
                b'G' => self.scalar_of(8)?,
                b'U' | b'C' | 0x8a | 0x8c => self.scalar_with_length(1)?,
                b'T' | b'X' | b'B' | 0x8b => self.scalar_with_length(4)?,
                0x8d | 0x8e | 0x96 => self.scalar_with_length(8)?,
                0x80 => {
                    self.take(1)?;
                }
                0x95 => {
                    self.take(8)?;
                }
                0x98 => {
                    self.top()?;
                }
                b'Q' => {
                    self.pop()?;
                    self.stack.push(Item::Scalar);
                }
                0x93 => {
                    self.pop()?;
                    self.pop()?;
                    self.stack.push(Item::Scalar);
                }
                // Containers.
                b']' | b'}' | b')' | 0x8f => {
                    let item = self.new_container(&[])?;
                    self.stack.push(item);
                }
                b'l' | b't' | b'd' | 0x91 => {
                    let items = self.pop_to_mark()?;
                    let item = self.new_container(&items)?;
                    self.stack.push(item);
                }
                b'i' => {
                    self.line()?;
                    self.line()?;
                    let items = self.pop_to_mark()?;
                    let item = self.new_container(&items)?;
                    self.stack.push(item);
                }
                b'o' => {
                    let items = self.pop_to_mark()?;
                    let item = self.new_container(&items)?;
                    self.stack.push(item);
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    let item = self.new_container(&items)?;
                    self.stack.push(item);
                }
                b'R' | 0x81 => {
                    let items = [self.pop()?, self.pop()?];
                    let item = self.new_container(&items)?;
                    self.stack.push(item);
                }
                0x92 => {
                    let items = [self.pop()?, self.pop()?, self.pop()?];
                    let item = self.new_container(&items)?;
                    self.stack.push(item);
                }
                // Filling a container below.
                b'a' | b'b' => {
                    let value = self.pop()?;
                    let target = self.top()?;
                    self.add_to(target, &[value])?;
                }
                b's' => {
                    let items = [self.pop()?, self.pop()?];
                    let target = self.top()?;
                    self.add_to(target, &items)?;
                }
                b'e' | b'u' | 0x90 => {
                    let items = self.pop_to_mark()?;
                    let target = self.top()?;
                    self.add_to(target, &items)?;
                }
                // The memo.
                b'p' => {
                    let key = self.decimal_line()?;
                    self.memo_put(key)?;
                }
                b'q' => {
                    let key = self.number(1)?;
                    self.memo_put(key)?;
                }
                b'r' => {
                    let key = self.number(4)?;
                    self.memo_put(key)?;
                }
                0x94 => {
                    let key = self.memo.len() as u64;
                    self.memo_put(key)?;
                }
                b'g' => {
                    let key = self.decimal_line()?;
                    self.memo_get(key)?;
                }
                b'h' => {
                    let key = self.number(1)?;
                    self.memo_get(key)?;
                }
                b'j' => {
                    let key = self.number(4)?;
                    self.memo_get(key)?;
                }
                _ => return Err(self.bad("an unknown opcode")),
            }
        }
    }

    fn scalar_of(&mut self, width: u64) -> Result<(), ShapeError> {
        self.take(width)?;
        self.stack.push(Item::Scalar);
        Ok(())
    }

    fn scalar_with_length(&mut self, width: u64) -> Result<(), ShapeError> {
        let length = self.number(width)?;
        self.take(length)?;
        self.stack.push(Item::Scalar);
        Ok(())
    }
}

/// The depth and the expanded size of every container, by an explicit post-order walk (no recursion).
fn measure(children: &[Vec<u32>]) -> Result<(), ShapeError> {
    const UNSEEN: u8 = 0;
    const OPEN: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![UNSEEN; children.len()];
    let mut depth = vec![0usize; children.len()];
    let mut expanded = vec![0u64; children.len()];
    for start in 0..children.len() {
        if state[start] != UNSEEN {
            continue;
        }
        // (container, index of the next child to visit)
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        state[start] = OPEN;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            if let Some(&child) = children[node].get(*next) {
                *next += 1;
                let child = child as usize;
                match state[child] {
                    OPEN => return Err(ShapeError::Recursive),
                    UNSEEN => {
                        state[child] = OPEN;
                        path.push((child, 0));
                    }
                    _ => {}
                }
                continue;
            }
            let deepest = children[node]
                .iter()
                .map(|&c| depth[c as usize])
                .max()
                .unwrap_or(0);
            depth[node] = deepest + 1;
            if depth[node] > MAX_DEPTH {
                return Err(ShapeError::TooDeep);
            }
            expanded[node] = children[node]
                .iter()
                .fold(1u64, |sum, &c| sum.saturating_add(expanded[c as usize]));
            if expanded[node] > MAX_EXPANDED {
                return Err(ShapeError::TooLarge);
            }
            state[node] = DONE;
            path.pop();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `depth` nested lists, protocol 2: `]]]...` then as many APPENDs.
    fn nested_lists(depth: usize) -> Vec<u8> {
        let mut p = vec![0x80, 2];
        p.extend(std::iter::repeat_n(b']', depth));
        p.extend(std::iter::repeat_n(b'a', depth - 1));
        p.push(b'.');
        p
    }

    #[test]
    fn a_plain_dict_of_lists_passes() {
        // pickle.dumps({"entries": [{"seq": 1, "sizes": [[4]]}], "version": "2.10"}, protocol=2)
        let p = b"\x80\x02}q\x00(X\x07\x00\x00\x00entriesq\x01]q\x02}q\x03(X\x03\x00\x00\x00seqq\x04K\x01X\x05\x00\x00\x00sizesq\x05]q\x06]q\x07K\x04aauaX\x07\x00\x00\x00versionq\x08X\x04\x00\x00\x002.10q\tu.";
        assert_eq!(check(p), Ok(()));
    }

    #[test]
    fn every_recorded_torch_dump_passes() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../diagnosis/tests/fixtures/flight_recorder"
        );
        let mut seen = 0;
        for case in std::fs::read_dir(dir).expect("fixtures").flatten() {
            let Ok(files) = std::fs::read_dir(case.path()) else {
                continue;
            };
            for file in files.flatten() {
                if file.path().extension().is_some_and(|e| e == "pickle") {
                    let bytes = std::fs::read(file.path()).expect("pickle");
                    assert_eq!(check(&bytes), Ok(()), "{}", file.path().display());
                    seen += 1;
                }
            }
        }
        assert!(seen > 0, "no recorded pickle under {dir}");
    }

    #[test]
    fn nesting_up_to_the_limit_passes_beyond_it_is_refused() {
        assert_eq!(check(&nested_lists(MAX_DEPTH)), Ok(()));
        assert_eq!(
            check(&nested_lists(MAX_DEPTH + 1)),
            Err(ShapeError::TooDeep)
        );
        assert_eq!(check(&nested_lists(1_000_000)), Err(ShapeError::TooDeep));
    }

    #[test]
    fn nesting_built_through_the_memo_with_a_flat_stack_is_refused() {
        // l0 = []; each next list is appended to the one before, fetched back from the memo: the stack never
        // holds more than two items, the structure nests 200 deep.
        let mut p = vec![0x80, 2, b']', b'q', 0];
        for i in 1..=200u8 {
            p.extend([b'h', i - 1, b']', b'q', i, b'a', b'0']);
        }
        p.push(b'.');
        assert_eq!(check(&p), Err(ShapeError::TooDeep));
    }

    #[test]
    fn a_deep_value_popped_before_the_end_is_refused_too() {
        let mut p = nested_lists(500);
        p.pop();
        p.extend([b'0', b'N', b'.']);
        assert_eq!(check(&p), Err(ShapeError::TooDeep));
    }

    #[test]
    fn shared_references_that_expand_past_the_limit_are_refused() {
        // l(i+1) = [l(i), l(i)]: 2^40 lists once copied out, 40 deep.
        let mut p = vec![0x80, 2, b']', b'q', 0];
        for i in 1..=40u8 {
            p.extend([b'h', i - 1, b'h', i - 1, 0x86, b'q', i, b'0']);
        }
        p.extend([b'h', 40, b'.']);
        assert_eq!(check(&p), Err(ShapeError::TooLarge));
    }

    #[test]
    fn a_list_that_contains_itself_is_refused() {
        // l = []; l.append(l)
        let p = [0x80, 2, b']', b'q', 0, b'h', 0, b'a', b'.'];
        assert_eq!(check(&p), Err(ShapeError::Recursive));
    }

    #[test]
    fn garbage_and_truncation_are_errors_not_panics() {
        for p in [
            &b""[..],
            b"\x80",
            b"\x80\x02X\xff\xff\xff\xff",
            b"a.",
            b"(u.",
            b"h\x05.",
            b"\xff",
        ] {
            assert!(
                matches!(check(p), Err(ShapeError::Malformed { .. })),
                "{p:?}"
            );
        }
    }
}
