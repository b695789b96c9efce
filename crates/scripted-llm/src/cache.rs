//! A simulated prefix cache, block by block as vLLM's automatic prefix caching keeps it.
//!
//! Token sequences are cut into blocks of `block_size`; each full block is identified by
//! a hash chained over all blocks before it, so a block is only reusable after the same
//! prefix. A request's cached prompt tokens are the full blocks of its prompt found, in
//! order from the start, capped one token short of the prompt (the engine always
//! computes the last prompt token). After a request its prompt and output blocks are
//! cached; when the cache holds more than `capacity` blocks the least recently used go.
//! This is what makes routing measurable: samples that share a prompt only hit the
//! cache on the backend that already saw it. A request's `cache_salt` (both servers take
//! one) seeds the chain, as vLLM mixes it into the first block's hash: requests share
//! blocks only with requests of the same salt.

use std::collections::{BTreeMap, HashMap};

use super::script::stable_hash;

/// The cache of one simulated engine.
#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    capacity: usize,
    /// Block hash → last use.
    blocks: HashMap<u64, u64>,
    /// Last use → block hash (for eviction in LRU order).
    by_use: BTreeMap<u64, u64>,
    clock: u64,
}

impl PrefixCache {
    /// A cache of at most `capacity` blocks of `block_size` tokens.
    pub fn new(block_size: usize, capacity: usize) -> Self {
        PrefixCache {
            block_size: block_size.max(1),
            capacity,
            blocks: HashMap::new(),
            by_use: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Forgets every block (vLLM's `/pause` does, unless told `clear_cache=false`).
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.by_use.clear();
    }

    fn chain(&self, salt: Option<&str>, tokens: &[u32]) -> Vec<u64> {
        let mut prev = salt.map_or(0, |salt| {
            let bytes: Vec<u64> = salt.bytes().map(u64::from).collect();
            stable_hash(&bytes) | 1
        });
        tokens
            .chunks_exact(self.block_size)
            .map(|block| {
                let mut parts = Vec::with_capacity(block.len() + 1);
                parts.push(prev);
                parts.extend(block.iter().map(|&t| u64::from(t)));
                prev = stable_hash(&parts);
                prev
            })
            .collect()
    }

    fn touch(&mut self, hash: u64) {
        self.clock += 1;
        if let Some(old) = self.blocks.insert(hash, self.clock) {
            self.by_use.remove(&old);
        }
        self.by_use.insert(self.clock, hash);
    }

    /// The prompt tokens of `prompt` found in the cache under `salt` (marking those
    /// blocks used).
    pub fn lookup(&mut self, salt: Option<&str>, prompt: &[u32]) -> usize {
        let usable = prompt.len().saturating_sub(1);
        let mut hit = 0;
        for h in self.chain(salt, &prompt[..usable]) {
            if !self.blocks.contains_key(&h) {
                break;
            }
            self.touch(h);
            hit += self.block_size;
        }
        hit
    }

    /// Caches the full blocks of `tokens` (a prompt followed by its output) under
    /// `salt`.
    pub fn insert(&mut self, salt: Option<&str>, tokens: &[u32]) {
        for h in self.chain(salt, tokens) {
            self.touch(h);
        }
        while self.blocks.len() > self.capacity {
            let Some((_, h)) = self.by_use.pop_first() else {
                break;
            };
            self.blocks.remove(&h);
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_whole_blocks_of_a_shared_prefix_only() {
        let mut c = PrefixCache::new(4, 100);
        let a: Vec<u32> = (0..10).collect();
        assert_eq!(c.lookup(None, &a), 0);
        c.insert(None, &a);
        // Same first 8 tokens, then different: two blocks hit.
        let b: Vec<u32> = (0..8).chain([99, 98, 97]).collect();
        assert_eq!(c.lookup(None, &b), 8);
        // A prompt equal to a cached one still computes its last token.
        assert_eq!(c.lookup(None, &a[..8]), 4);
        // A different first block breaks the chain even if later blocks match.
        let d: Vec<u32> = [50, 1, 2, 3].into_iter().chain(4..10).collect();
        assert_eq!(c.lookup(None, &d), 0);
    }

    #[test]
    fn evicts_the_least_recently_used_blocks() {
        let mut c = PrefixCache::new(2, 4);
        let a = [1, 2, 3, 4, 5];
        let b = [9, 8, 7, 6, 5];
        c.insert(None, &a);
        c.insert(None, &b);
        assert_eq!(c.len(), 4);
        c.lookup(None, &a); // a's blocks are now the newest
        c.insert(None, &[20, 21, 22]); // one more block: b's first goes
        assert_eq!(c.len(), 4);
        assert_eq!(c.lookup(None, &a), 4);
        assert_eq!(c.lookup(None, &b), 0);
    }

    #[test]
    fn a_salt_is_a_namespace_of_its_own() {
        let mut c = PrefixCache::new(4, 100);
        let prompt: Vec<u32> = (0..17).collect();
        c.insert(Some("policy-v1"), &prompt);
        assert_eq!(c.lookup(Some("policy-v1"), &prompt), 16);
        assert_eq!(
            c.lookup(Some("policy-v2"), &prompt),
            0,
            "another version's KV"
        );
        assert_eq!(
            c.lookup(None, &prompt),
            0,
            "unsalted requests share nothing with salted"
        );
        c.insert(None, &prompt);
        assert_eq!(c.lookup(None, &prompt), 16);
    }
}
