//! Unit tests of the simulator's parts on small inline scenarios.

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::llm::Verdict;

const MINI: &str = r#"
group = "t"
lang = "en"
[[bots]]
name = "A"
skills = ["x"]
[[bots]]
name = "B"
[[bots]]
name = "C"
[[messages]]
at = 0
from = "h"
text = "question about x"
judge = { A = 0.9, B = 0.6, C = { speak = false, relevance = 0.1 } }
"#;

#[test]
fn parses_and_compiles() {
    let w = World::parse(MINI, "mini").unwrap();
    assert_eq!(w.scenario.name, "mini");
    assert_eq!(w.bots.len(), 3);
    assert_eq!(w.bots[0].min_delay_ms, 1000, "peers.toml defaults apply");
    assert_eq!(
        w.scenario.messages[0].judge["C"].verdict(),
        Verdict {
            speak: false,
            relevance: 0.1
        }
    );
    assert!(World::parse(&MINI.replace("C = {", "D = {"), "x").is_err());
}

#[test]
fn distributions_stay_in_range() {
    let mut rng = StdRng::seed_from_u64(7);
    let u = Dist::Uniform {
        min: 10.0,
        max: 20.0,
    };
    let l = Dist::Lognormal {
        median: 1000.0,
        sigma: 0.5,
        max: Some(3000.0),
    };
    let mut ls = Vec::new();
    for _ in 0..2000 {
        assert!((10..=20).contains(&u.sample(&mut rng)));
        let x = l.sample(&mut rng);
        assert!(x <= 3000);
        ls.push(x);
    }
    ls.sort_unstable();
    let median = ls[ls.len() / 2];
    assert!((850..1150).contains(&median), "median {median}");
}

#[test]
fn one_interjection_under_botmesh() {
    let w = World::parse(MINI, "mini").unwrap();
    for seed in 0..20 {
        let t = run_once(&w, PolicyKind::Botmesh, seed);
        assert_eq!(t.bot_posts, 1, "seed {seed}");
        assert_eq!(t.right_first, 1, "seed {seed}");
    }
}
