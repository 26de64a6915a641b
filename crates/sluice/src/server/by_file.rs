//! What a cache keeps per file between requests (NFSv3's READ and WRITE
//! descriptors, the descriptors stable WRITEs flush through), with a count
//! of all of it.
//!
//! What goes out of it is given back to the caller, to be dropped once
//! the caller has let go of the cache's lock: closing a removed file's
//! last descriptor frees its blocks, which can take a while.

use std::collections::HashMap;

/// The file, as (device, inode).
pub type FileKey = (u64, u64);

/// Entries by file, and how many there are in all.
#[derive(Debug)]
pub struct ByFile<T> {
    map: HashMap<FileKey, Vec<T>>,
    len: usize,
}

impl<T> Default for ByFile<T> {
    fn default() -> Self {
        ByFile {
            map: HashMap::new(),
            len: 0,
        }
    }
}

impl<T> ByFile<T> {
    /// Entries in all.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entries of `file`.
    pub fn of(&self, file: FileKey) -> &[T] {
        self.map.get(&file).map_or(&[], Vec::as_slice)
    }

    /// The entries of `file`, to change in place.
    pub fn of_mut(&mut self, file: FileKey) -> &mut [T] {
        self.map.get_mut(&file).map_or(&mut [], Vec::as_mut_slice)
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.map.values().flatten()
    }

    /// Adds an entry of `file`.
    pub fn push(&mut self, file: FileKey, v: T) {
        self.map.entry(file).or_default().push(v);
        self.len += 1;
    }

    /// Takes the entry of `file` added last.
    pub fn pop(&mut self, file: FileKey) -> Option<T> {
        let list = self.map.get_mut(&file)?;
        let v = list.pop()?;
        if list.is_empty() {
            self.map.remove(&file);
        }
        self.len -= 1;
        Some(v)
    }

    /// Takes every entry of `file`.
    #[must_use]
    pub fn remove(&mut self, file: FileKey) -> Vec<T> {
        let gone = self.map.remove(&file).unwrap_or_default();
        self.len -= gone.len();
        gone
    }

    /// Keeps the entries of `file` that `keep` says yes to, and gives
    /// back the others.
    #[must_use]
    pub fn retain_of(&mut self, file: FileKey, keep: impl FnMut(&T) -> bool) -> Vec<T> {
        let Some(list) = self.map.get_mut(&file) else {
            return Vec::new();
        };
        let gone = take_unkept(list, keep);
        if list.is_empty() {
            self.map.remove(&file);
        }
        self.len -= gone.len();
        gone
    }

    /// Keeps the entries `keep` says yes to, and gives back the others.
    #[must_use]
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut gone = Vec::new();
        self.map.retain(|_, list| {
            gone.extend(take_unkept(list, &mut keep));
            !list.is_empty()
        });
        self.len -= gone.len();
        gone
    }
}

/// Takes the entries of `list` that `keep` says no to out of it.
fn take_unkept<T>(list: &mut Vec<T>, mut keep: impl FnMut(&T) -> bool) -> Vec<T> {
    list.extract_if(.., |v| !keep(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_follows_every_change() {
        let mut b = ByFile::default();
        for (file, v) in [((1, 1), 1), ((1, 1), 2), ((1, 2), 3), ((2, 1), 4)] {
            b.push(file, v);
        }
        assert_eq!(b.len(), 4);
        assert_eq!(b.of((1, 1)), &[1, 2]);
        assert_eq!(b.pop((1, 1)), Some(2));
        assert_eq!(b.retain_of((1, 1), |&v| v != 1), vec![1]);
        assert!(b.of((1, 1)).is_empty());
        assert_eq!(b.pop((1, 1)), None);
        assert_eq!(b.len(), 2);
        assert_eq!(b.retain(|&v| v == 4), vec![3]);
        assert_eq!(b.remove((2, 1)), vec![4]);
        assert!(b.is_empty() && b.iter().next().is_none());
    }
}
