//! A persistent (copy-on-write) B+ tree keyed by `usize`: the region table's
//! snapshot structure ([`super::table`]).
//!
//! A [`Tree`] is a cheap handle (one `Arc` to the root). An update copies
//! only the nodes on the path from the root to the leaf it changes
//! (`Arc::make_mut`: a node shared with another tree — a published snapshot
//! — is cloned, one this tree owns alone is changed in place) and shares
//! every other node with the tree it came from. Cost of `insert`/`remove`:
//! O(`MAX` · log n) pointer copies and reference-count increments, O(log n)
//! allocations; `find`: one binary search per level, O(log n). A node keeps
//! its keys and children inline (`arrayvec`), so a step down a level loads
//! one pointer.
//!
//! Invariants (checked by `check` in the tests): keys strictly ascending in
//! every node and across the leaves in order; an inner node's `keys[i]` is
//! the smallest key under `kids[i]`; every leaf at depth `depth`; every node
//! but the root holds `MIN..=MAX` entries, the root `1..=MAX` (an empty
//! tree has no root).
//!
//! A [`Pos`] names an entry by its child index at each level (`BITS` bits a
//! level, the root's highest), so a cache can go back to an entry of the
//! same tree in `depth` indexings, without a search. A tree deeper than
//! `MAX_DEPTH` (more than ~2·16^5 entries) gives no positions.
//!
//! No locks, no atomics beyond `Arc`'s: a tree is changed by its one owner
//! and shared only once it no longer changes.

use arrayvec::ArrayVec;
use std::sync::Arc;

/// Most entries of a node (a power of two: `BITS` bits of a [`Pos`]).
const MAX: usize = 32;
const BITS: u32 = MAX.trailing_zeros();
/// Fewest entries of a non-root node; below it a node is merged with a
/// neighbour (and split again if the two hold more than `MAX`).
const MIN: usize = MAX / 4;
/// Deepest tree whose positions fit a `u32` below `u32::MAX`.
const MAX_DEPTH: u32 = 31 / BITS;
/// A node's room: `MAX` and the one entry an insert adds before the split.
const CAP: usize = MAX + 1;

/// Where an entry sits in one tree: see the module docs.
pub type Pos = u32;

/// A node keeps its keys and children inline (`ArrayVec`), so a search
/// step down a level is one pointer, not three.
#[derive(Debug, Clone)]
struct Node<T> {
    keys: ArrayVec<usize, CAP>,
    kids: Kids<T>,
}

// Clippy cannot size the generic leaf variant; for the table's `T` (an
// `Arc`, one pointer) both variants are the same size.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Kids<T> {
    Leaf(ArrayVec<T, CAP>),
    Inner(ArrayVec<Arc<Node<T>>, CAP>),
}

/// An entry [`Tree::find`] found.
#[derive(Debug)]
pub struct Found<'a, T> {
    /// Its position, if the tree is shallow enough to give positions.
    pub pos: Option<Pos>,
    /// Its key.
    pub key: usize,
    /// Its value.
    pub val: &'a T,
}

/// See the module docs.
#[derive(Debug)]
pub struct Tree<T> {
    root: Option<Arc<Node<T>>>,
    len: usize,
    depth: u32,
}

impl<T> Clone for Tree<T> {
    fn clone(&self) -> Self {
        Tree {
            root: self.root.clone(),
            len: self.len,
            depth: self.depth,
        }
    }
}

impl<T> Default for Tree<T> {
    fn default() -> Self {
        Tree {
            root: None,
            len: 0,
            depth: 0,
        }
    }
}

/// Index of the last key `<= key` in `keys`, and the binary-search steps
/// (branch-free halving: the compare feeds a conditional move, so a search
/// for a random address costs no mispredicted branches).
#[inline(always)]
fn floor(keys: &[usize], key: usize) -> (Option<usize>, u32) {
    let Some(&first) = keys.first() else {
        return (None, 0);
    };
    let (mut base, mut size, mut steps) = (0usize, keys.len(), 0u32);
    while size > 1 {
        steps += 1;
        let half = size / 2;
        let mid = base + half;
        base = if keys[mid] <= key { mid } else { base };
        size -= half;
    }
    ((first <= key).then_some(base), steps)
}

impl<T> Node<T> {
    fn leaf(key: usize, val: T) -> Node<T> {
        Node {
            keys: std::iter::once(key).collect(),
            kids: Kids::Leaf(std::iter::once(val).collect()),
        }
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    /// Splits off the upper half as a new node.
    fn split(&mut self) -> Node<T> {
        let at = self.len() / 2;
        let keys = self.keys.drain(at..).collect();
        let kids = match &mut self.kids {
            Kids::Leaf(v) => Kids::Leaf(v.drain(at..).collect()),
            Kids::Inner(v) => Kids::Inner(v.drain(at..).collect()),
        };
        Node { keys, kids }
    }

    /// Moves `right`'s entries (all its keys above this node's, both at one
    /// level) into this node while it has fewer than `want`; returns what
    /// is left of `right`, if anything.
    fn take_from(&mut self, mut right: Node<T>, want: usize) -> Option<Node<T>> {
        let n = want.saturating_sub(self.len()).min(right.len());
        self.keys.extend(right.keys.drain(..n));
        match (&mut self.kids, &mut right.kids) {
            (Kids::Leaf(a), Kids::Leaf(b)) => a.extend(b.drain(..n)),
            (Kids::Inner(a), Kids::Inner(b)) => a.extend(b.drain(..n)),
            _ => unreachable!("siblings at one level are both leaves or both inner"),
        }
        (right.len() > 0).then_some(right)
    }
}

impl<T: Clone> Node<T> {
    /// Inserts under this node; returns the upper half if it split.
    fn insert(&mut self, key: usize, val: T) -> Option<Node<T>> {
        let i = floor(&self.keys, key).0;
        match &mut self.kids {
            Kids::Leaf(v) => {
                let at = i.map_or(0, |i| i + 1);
                self.keys.insert(at, key);
                v.insert(at, val);
            }
            Kids::Inner(kids) => {
                let i = i.unwrap_or(0);
                let child = Arc::make_mut(&mut kids[i]);
                let right = child.insert(key, val);
                self.keys[i] = child.keys[0];
                if let Some(right) = right {
                    self.keys.insert(i + 1, right.keys[0]);
                    kids.insert(i + 1, Arc::new(right));
                }
            }
        }
        (self.len() > MAX).then(|| self.split())
    }

    /// Removes `key` (which is under this node) and returns its value;
    /// merges a child left below `MIN` with a neighbour.
    fn remove(&mut self, key: usize) -> Option<T> {
        let i = floor(&self.keys, key).0?;
        match &mut self.kids {
            Kids::Leaf(v) => {
                if self.keys[i] != key {
                    return None;
                }
                self.keys.remove(i);
                Some(v.remove(i))
            }
            Kids::Inner(kids) => {
                let child = Arc::make_mut(&mut kids[i]);
                let out = child.remove(key)?;
                let short = child.len() < MIN;
                if let Some(&k) = child.keys.first() {
                    self.keys[i] = k;
                }
                if short {
                    self.rebalance(i);
                }
                Some(out)
            }
        }
    }

    /// Merges child `i` with a neighbour, or — if the two hold more than
    /// `MAX` — shares their entries out again, neither left below `MIN`
    /// (short left: it takes from the right up to half the total; short
    /// right: the left's upper half joins it).
    fn rebalance(&mut self, i: usize) {
        let Kids::Inner(kids) = &mut self.kids else {
            return;
        };
        if kids.len() < 2 {
            return;
        }
        let a = if i + 1 < kids.len() { i } else { i - 1 };
        let b = Arc::unwrap_or_clone(kids.remove(a + 1));
        self.keys.remove(a + 1);
        let left = Arc::make_mut(&mut kids[a]);
        let total = left.len() + b.len();
        let want = if total > MAX { total / 2 } else { total };
        if left.len() > want {
            // The left one is the full one: move its top half right.
            let mut right = left.split();
            let rest = right.take_from(b, usize::MAX);
            debug_assert!(rest.is_none());
            self.keys.insert(a + 1, right.keys[0]);
            kids.insert(a + 1, Arc::new(right));
        } else if let Some(right) = left.take_from(b, want) {
            self.keys.insert(a + 1, right.keys[0]);
            kids.insert(a + 1, Arc::new(right));
        }
    }
}

impl<T> Tree<T> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The entry with the largest key `<= key`, and the binary-search
    /// steps taken.
    #[inline(always)]
    pub fn find(&self, key: usize) -> (Option<Found<'_, T>>, u32) {
        let Some(mut node) = self.root.as_deref() else {
            return (None, 0);
        };
        let (mut pos, mut steps) = (0u32, 0u32);
        loop {
            let (i, s) = floor(&node.keys, key);
            steps += s;
            let Some(i) = i else {
                return (None, steps);
            };
            pos = (pos << BITS) | i as u32;
            match &node.kids {
                Kids::Leaf(v) => {
                    let found = Found {
                        pos: (self.depth <= MAX_DEPTH).then_some(pos),
                        key: node.keys[i],
                        val: &v[i],
                    };
                    return (Some(found), steps);
                }
                Kids::Inner(kids) => node = &kids[i],
            }
        }
    }

    /// The entry at `pos` (from [`Tree::find`] on this tree), if any.
    #[inline(always)]
    pub fn at(&self, pos: Pos) -> Option<&T> {
        let mut node = self.root.as_deref()?;
        let mut level = self.depth;
        loop {
            level = level.checked_sub(1)?;
            let i = ((pos >> (level * BITS)) as usize) & (MAX - 1);
            match &node.kids {
                Kids::Leaf(v) => return v.get(i),
                Kids::Inner(kids) => node = kids.get(i)?,
            }
        }
    }

    /// The entries in key order, from the one with the largest key `<= key`
    /// (or the first, if none is).
    pub fn iter_from(&self, key: usize) -> Iter<'_, T> {
        let mut stack = Vec::with_capacity(self.depth as usize);
        let mut node = self.root.as_deref();
        while let Some(n) = node {
            let i = floor(&n.keys, key).0.unwrap_or(0);
            match &n.kids {
                Kids::Leaf(_) => {
                    stack.push((n, i));
                    node = None;
                }
                Kids::Inner(kids) => {
                    stack.push((n, i + 1));
                    node = Some(&kids[i]);
                }
            }
        }
        Iter { stack }
    }

    /// All entries in key order.
    pub fn iter(&self) -> Iter<'_, T> {
        self.iter_from(0)
    }
}

impl<T: Clone> Tree<T> {
    /// Adds an entry (`key` must not be in the tree).
    pub fn insert(&mut self, key: usize, val: T) {
        let Some(root) = &mut self.root else {
            self.root = Some(Arc::new(Node::leaf(key, val)));
            self.len = 1;
            self.depth = 1;
            return;
        };
        if let Some(right) = Arc::make_mut(root).insert(key, val) {
            let left = Arc::clone(root);
            *root = Arc::new(Node {
                keys: [left.keys[0], right.keys[0]].into_iter().collect(),
                kids: Kids::Inner([left, Arc::new(right)].into_iter().collect()),
            });
            self.depth += 1;
        }
        self.len += 1;
    }

    /// Removes the entry with key `key`; returns its value, or `None` (and
    /// copies nothing) if there is none.
    pub fn remove(&mut self, key: usize) -> Option<T> {
        if self.find(key).0.is_none_or(|f| f.key != key) {
            return None;
        }
        let root = self.root.as_mut()?;
        let out = Arc::make_mut(root).remove(key)?;
        self.len -= 1;
        // A root left with one child gives way to it; an empty one goes.
        while let Some(root) = &self.root {
            match &root.kids {
                Kids::Inner(kids) if kids.len() == 1 => {
                    self.root = Some(Arc::clone(&kids[0]));
                    self.depth -= 1;
                }
                Kids::Leaf(v) if v.is_empty() => {
                    self.root = None;
                    self.depth = 0;
                }
                _ => break,
            }
        }
        Some(out)
    }
}

/// In-order iterator of `(key, &value)`; see [`Tree::iter_from`].
pub struct Iter<'a, T> {
    stack: Vec<(&'a Node<T>, usize)>,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = (usize, &'a T);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (node, i) = self.stack.last_mut()?;
            let (node, at) = (*node, *i);
            *i += 1;
            match &node.kids {
                Kids::Leaf(v) if at < v.len() => return Some((node.keys[at], &v[at])),
                Kids::Inner(kids) if at < kids.len() => self.stack.push((&kids[at], 0)),
                _ => {
                    self.stack.pop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Checks every invariant of the module docs; returns the entry count.
    fn check<T>(t: &Tree<T>) -> usize {
        fn walk<T>(n: &Node<T>, depth: u32, root: bool, leaves: &mut Vec<u32>) -> usize {
            assert!(n.keys.windows(2).all(|w| w[0] < w[1]), "keys unsorted");
            assert!(n.len() <= MAX && n.len() >= if root { 1 } else { MIN });
            match &n.kids {
                Kids::Leaf(v) => {
                    assert_eq!(v.len(), n.len());
                    leaves.push(depth);
                    v.len()
                }
                Kids::Inner(kids) => {
                    assert_eq!(kids.len(), n.len());
                    assert!(!root || kids.len() >= 2, "a root with one child");
                    let mut sum = 0;
                    for (k, kid) in n.keys.iter().zip(kids) {
                        assert_eq!(*k, kid.keys[0], "separator is not the child's minimum");
                        sum += walk(kid, depth + 1, false, leaves);
                    }
                    sum
                }
            }
        }
        let Some(root) = &t.root else {
            assert_eq!((t.len, t.depth), (0, 0));
            return 0;
        };
        let mut leaves = Vec::new();
        let n = walk(root, 1, true, &mut leaves);
        assert!(leaves.iter().all(|&d| d == t.depth), "leaves at {leaves:?}");
        assert_eq!(n, t.len);
        let keys: Vec<usize> = t.iter().map(|(k, _)| k).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "leaves out of order");
        n
    }

    /// Every query against a `BTreeMap` oracle.
    fn agrees(
        t: &Tree<u64>,
        oracle: &BTreeMap<usize, u64>,
        probe: usize,
    ) -> Result<(), TestCaseError> {
        let want = oracle.range(..=probe).next_back().map(|(&k, &v)| (k, v));
        let (got, _) = t.find(probe);
        prop_assert_eq!(got.as_ref().map(|f| (f.key, *f.val)), want);
        if let Some(Found {
            pos: Some(pos),
            val,
            ..
        }) = got
        {
            prop_assert_eq!(t.at(pos), Some(val));
        }
        let from: Vec<(usize, u64)> = t.iter_from(probe).map(|(k, v)| (k, *v)).take(3).collect();
        let start = want.map_or(0, |(k, _)| k);
        let expect: Vec<(usize, u64)> = oracle
            .range(start..)
            .map(|(&k, &v)| (k, v))
            .take(3)
            .collect();
        prop_assert_eq!(from, expect);
        Ok(())
    }

    proptest! {
        /// Random inserts and removes (dense keys, so nodes split, merge and
        /// the root grows and shrinks), every snapshot kept unchanged by
        /// later updates.
        #[test]
        fn against_btreemap(ops in proptest::collection::vec((0u8..3, 0usize..2000), 1..3000)) {
            let mut t: Tree<u64> = Tree::default();
            let mut oracle = BTreeMap::new();
            let mut kept: Vec<(Tree<u64>, BTreeMap<usize, u64>)> = Vec::new();
            for (n, (op, key)) in ops.into_iter().enumerate() {
                match op {
                    0 if !oracle.contains_key(&key) => {
                        t.insert(key, n as u64);
                        oracle.insert(key, n as u64);
                    }
                    1 | 0 => prop_assert_eq!(t.remove(key), oracle.remove(&key)),
                    _ => agrees(&t, &oracle, key)?,
                }
                if n % 500 == 0 {
                    kept.push((t.clone(), oracle.clone()));
                }
            }
            prop_assert_eq!(check(&t), oracle.len());
            for (old, o) in &kept {
                prop_assert_eq!(check(old), o.len());
                let all: Vec<(usize, u64)> = old.iter().map(|(k, v)| (k, *v)).collect();
                let want: Vec<(usize, u64)> = o.iter().map(|(&k, &v)| (k, v)).collect();
                prop_assert_eq!(all, want);
            }
        }
    }

    /// Fill to four levels, then empty in an order that merges everywhere.
    #[test]
    fn grows_and_shrinks() {
        let mut t: Tree<u64> = Tree::default();
        let n = 40_000;
        for k in 0..n {
            t.insert(k * 7 % n, k as u64);
        }
        check(&t);
        assert!(t.depth >= 3, "depth {}", t.depth);
        for k in (0..n)
            .step_by(3)
            .chain((1..n).step_by(3))
            .chain((2..n).step_by(3))
        {
            assert!(t.remove(k).is_some(), "{k}");
            if k % 1000 == 0 {
                check(&t);
            }
        }
        assert_eq!(check(&t), 0);
        assert!(t.remove(5).is_none());
    }
}
