//! `IdMap` and `IdSet`: the maps and sets keyed by envelope ids.
//!
//! A receiver looks every envelope's id up several times (the replay cache, the
//! group's duplicate index, the decisions made, the decision trail). SipHash, the
//! standard library's, took 1.9 % of a busy receiver's samples, about half of it in
//! these lookups (docs/benchmarks.md, issue 40's eighth look). A [`Ulid`] is 16
//! bytes, and `foldhash` hashes it in a few instructions. Its seed is random per process, so a
//! set of colliding ids cannot be prepared in advance; and every id in these maps
//! comes from this node or from a peer whose signature was checked first.

use std::collections::{HashMap, HashSet};

use ulid::Ulid;

/// The hasher of [`IdMap`] and [`IdSet`]: `foldhash`'s fast variant, seeded at random.
pub(crate) type IdHasher = foldhash::fast::RandomState;

/// A map keyed by envelope id.
pub(crate) type IdMap<V> = HashMap<Ulid, V, IdHasher>;

/// A set of envelope ids.
pub(crate) type IdSet = HashSet<Ulid, IdHasher>;
