//! The report as markdown: docs/turn-taking.md.

use std::fmt::Write as _;

use super::*;

pub(super) fn opt_pct(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.1}%"))
}

pub(super) fn opt_ms(x: Option<u64>) -> String {
    x.map_or("–".into(), |v| format!("{v}"))
}

pub(super) fn chain(m: &Metrics) -> String {
    if m.runaway_runs > 0 {
        format!("{}+ ({} runaway)", m.longest_chain, m.runaway_runs)
    } else {
        m.longest_chain.to_string()
    }
}

/// The headline table: one row per policy.
pub fn headline_table(s: &Section) -> String {
    let mut out = String::from(
        "| policy | dup. interjections / human msg | runs with a dup. | right bot first | unanswered | first answer p50 / p95 (ms) | longest bot chain | LLM calls / human msg (judge + reply) | judge prompt bytes (mean) |\n\
|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in &s.policies {
        let m = &p.metrics;
        let judge = m.judge_human_per_msg + m.judge_bot_per_msg + m.rejudge_per_msg;
        let _ = writeln!(
            out,
            "| {} | {:.3} | {:.1}% | {} | {} | {} / {} | {} | {:.2} ({:.2} + {:.2}) | {} |",
            p.policy.as_str(),
            m.dup_per_human_msg,
            m.runs_with_dup_pct,
            opt_pct(m.right_bot_first_pct),
            opt_pct(m.unanswered_pct),
            opt_ms(m.ttfa_p50_ms),
            opt_ms(m.ttfa_p95_ms),
            chain(m),
            m.llm_calls_per_human_msg,
            judge,
            m.reply_per_msg,
            m.judge_prompt_bytes_mean
                .map_or("–".into(), |b| format!("{b:.0}")),
        );
    }
    out
}

/// One row of the mechanism and seed tables: the measures the targets are about.
pub(super) fn measures_cells(m: &Metrics) -> String {
    format!(
        "{:.3} | {} | {} | {} / {} | {:.2} ({:.2} discarded)",
        m.dup_per_human_msg,
        opt_pct(m.right_bot_first_pct),
        opt_pct(m.unanswered_pct),
        opt_ms(m.ttfa_p50_ms),
        opt_ms(m.ttfa_p95_ms),
        m.llm_calls_per_human_msg,
        m.discarded_per_msg,
    )
}

/// botmesh with each mechanism on, one turned off at a time, and the shared judge.
pub(super) fn mechanism_table(r: &Report) -> String {
    let Some(bm) = r.overall.get(PolicyKind::Botmesh) else {
        return String::new();
    };
    if r.ablations.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n### What each mechanism buys (all scenarios, one turned off at a time)\n\n\
| botmesh | dup. / human msg | right bot first | unanswered | first answer p50 / p95 (ms) | LLM calls / human msg |\n\
|---|---:|---:|---:|---:|---:|\n",
    );
    let _ = writeln!(
        out,
        "| everything on (own judge) | {} |",
        measures_cells(bm)
    );
    for a in &r.ablations {
        let _ = writeln!(out, "| {} | {} |", a.name, measures_cells(&a.metrics));
    }
    if let Some(sh) = r.overall.get(PolicyKind::BotmeshShared) {
        let _ = writeln!(
            out,
            "| shared judge (`[mesh] judge = \"shared\"`) | {} |",
            measures_cells(sh)
        );
    }
    out
}

/// The headline measures at several base seeds.
pub(super) fn seed_table(r: &Report) -> String {
    if r.seeds.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n### The same measures at other seeds (50 runs of every scenario each)\n\n\
| seed | policy | dup. / human msg | right bot first | unanswered | first answer p50 / p95 (ms) | LLM calls / human msg |\n\
|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for row in &r.seeds {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            row.seed,
            row.policy.as_str(),
            measures_cells(&row.metrics)
        );
    }
    out
}

pub(super) fn group_table(groups: &[Section]) -> String {
    let mut out = String::from(
        "| group | policy | dup. / human msg | right bot first | unanswered | \"everyone\" coverage | first answer p50 / p95 (ms) | longest chain | LLM calls / human msg | prompt bytes |\n\
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for g in groups {
        for (i, p) in g.policies.iter().enumerate() {
            let m = &p.metrics;
            let _ = writeln!(
                out,
                "| {} | {} | {:.3} | {} | {} | {} | {} / {} | {} | {:.2} | {} |",
                if i == 0 {
                    format!("**{}** ({})", g.name, g.scenarios)
                } else {
                    String::new()
                },
                p.policy.as_str(),
                m.dup_per_human_msg,
                opt_pct(m.right_bot_first_pct),
                opt_pct(m.unanswered_pct),
                opt_pct(m.want_all_coverage_pct),
                opt_ms(m.ttfa_p50_ms),
                opt_ms(m.ttfa_p95_ms),
                chain(m),
                m.llm_calls_per_human_msg,
                m.judge_prompt_bytes_mean
                    .map_or("–".into(), |b| format!("{b:.0}")),
            );
        }
    }
    out
}

pub(super) fn scenario_table(scenarios: &[Section]) -> String {
    let pols: Vec<PolicyKind> = scenarios
        .first()
        .map(|s| s.policies.iter().map(|p| p.policy).collect())
        .unwrap_or_default();
    let mut out = String::from("| scenario | group |");
    for p in &pols {
        let _ = write!(out, " {} dup / right / chain / calls |", p.as_str());
    }
    out.push_str("\n|---|---|");
    for _ in &pols {
        out.push_str("---|");
    }
    out.push('\n');
    for s in scenarios {
        let _ = write!(out, "| {} | {} |", s.name, s.group);
        for p in &s.policies {
            let m = &p.metrics;
            let _ = write!(
                out,
                " {:.2} / {} / {} / {:.1} |",
                m.dup_per_human_msg,
                m.right_bot_first_pct
                    .map_or("–".into(), |v| format!("{v:.0}%")),
                chain(m),
                m.llm_calls_per_human_msg
            );
        }
        out.push('\n');
    }
    out
}

pub(super) fn breakdown_table(s: &Section) -> String {
    let mut out = String::from(
        "| policy | judge: human msgs | judge: bot msgs | re-judge | reply calls | of which discarded | bot messages posted |\n\
|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in &s.policies {
        let m = &p.metrics;
        let _ = writeln!(
            out,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            p.policy.as_str(),
            m.judge_human_per_msg,
            m.judge_bot_per_msg,
            m.rejudge_per_msg,
            m.reply_per_msg,
            m.discarded_per_msg,
            m.bot_posts_per_msg
        );
    }
    out
}

/// The whole `docs/turn-taking.md`, from a report.
pub fn render_doc(r: &Report) -> String {
    let mut d = String::new();
    let _ = write!(
        d,
        "# Turn-taking: botmesh against earlier policies, simulated\n\n\
<!-- Generated by `botmesh simulate --seed {seed} --runs {runs} --write-doc docs/turn-taking.md`. \
Do not edit by hand: change the simulator or the scenarios and regenerate. -->\n\n\
Generated by `botmesh simulate --seed {seed} --runs {runs} --write-doc docs/turn-taking.md` \
({n} scenarios in `scenarios/`, each run {runs} times per policy with seeds derived from {seed}; \
the same command gives the same file).\n\n",
        seed = r.seed,
        runs = r.runs,
        n = r.catalogue.len()
    );
    d.push_str(DOC_METHOD);
    let _ = write!(
        d,
        "\n## Results: all scenarios\n\n{}\n",
        headline_table(&r.overall)
    );
    if !r.targets.is_empty() {
        d.push_str(
            "\n### botmesh against its targets\n\n| target | met | numbers |\n|---|---|---|\n",
        );
        for t in &r.targets {
            let _ = writeln!(
                d,
                "| {} | {} | {} |",
                t.target,
                if t.met { "yes" } else { "**no**" },
                t.detail
            );
        }
    }
    let _ = write!(
        d,
        "\n### Where the LLM calls go (per human message)\n\n{}",
        breakdown_table(&r.overall)
    );
    if let Some(bm) = r.overall.get(PolicyKind::Botmesh) {
        d.push_str(
            "\n### botmesh's decisions (all runs)\n\n| action/reason | count |\n|---|---:|\n",
        );
        for (k, v) in &bm.reasons {
            let _ = writeln!(d, "| {k} | {v} |");
        }
    }
    d.push_str(&mechanism_table(r));
    d.push_str(&seed_table(r));
    d.push_str(&findings(r));
    let _ = write!(
        d,
        "\n## Results per scenario group\n\n{}",
        group_table(&r.groups)
    );
    let _ = write!(
        d,
        "\n## Results per scenario\n\nEach cell: duplicate interjections per human message / right bot first / longest chain / LLM calls per human message.\n\n{}",
        scenario_table(&r.scenarios)
    );
    d.push_str("\n## The scenarios\n\n| scenario | group | lang | bots | human msgs | what it exercises |\n|---|---|---|---:|---:|---|\n");
    for s in &r.catalogue {
        let _ = writeln!(
            d,
            "| {} | {} | {} | {} | {} | {} |",
            s.name,
            s.group,
            s.lang,
            s.bots,
            s.messages,
            s.description.replace('|', "\\|")
        );
    }
    d.push_str(DOC_FORMAT);
    d
}

/// Data-driven observations: only what the numbers of this report support.
pub(super) fn findings(r: &Report) -> String {
    let mut d = String::from("\n### Findings\n\n");
    let Some(bm) = r.overall.get(PolicyKind::Botmesh) else {
        d.push_str("botmesh was not run.\n");
        return d;
    };
    let reason = |k: &str| bm.reasons.get(k).copied().unwrap_or(0);
    let info = |name: &str| r.catalogue.iter().find(|c| c.name == name);
    for t in r.targets.iter().filter(|t| !t.met) {
        let _ = writeln!(d, "- **Missed: {}** — {}.", t.target, t.detail);
    }

    // Duplicates.
    let dup_scen: Vec<&Section> = r
        .scenarios
        .iter()
        .filter(|s| {
            s.get(PolicyKind::Botmesh)
                .is_some_and(|m| m.dup_per_human_msg > 0.0)
        })
        .collect();
    if !dup_scen.is_empty() {
        let all_lossy = dup_scen
            .iter()
            .all(|s| info(&s.name).is_some_and(|c| c.lossy));
        let _ = writeln!(
            d,
            "- botmesh's duplicates all come from {}. A bot posts an interjection only once its claim has reached every \
peer, so a late claim cannot land after the peer's answer, except when the acknowledgements do not all come back \
within `claim_ack_timeout_ms`: the bot then posts anyway (`post/claim_unacked`: {} times), and a claim still in \
transit can meet the other bot's answer.",
            if all_lossy {
                "scenarios that lose claims or messages"
            } else {
                "these scenarios (not all of them lossy)"
            },
            reason("post/claim_unacked")
        );
    } else {
        let network = r
            .groups
            .iter()
            .find(|g| g.name == "network")
            .and_then(|g| g.get(PolicyKind::Botmesh))
            .and_then(|m| m.right_bot_first_pct);
        let _ = writeln!(
            d,
            "- botmesh posted no duplicate interjection in any run. Under loss a claim can need several retries \
(200, 400, 800 ms …) and arrive late; what keeps a late claim from producing a second answer is the claim's \
acknowledgement: a bot posts an interjection only once its own claim has reached every peer, and then commits \
on its board in one step with the last check (`ClaimBoard::commit`). A peer that committed first says so in its \
acknowledgement, and the bot throws its written reply away (`yield_writing/already_answered`, which also counts \
answers heard as messages while writing: {} times); a \
better claim that arrived before the commit makes it stand by with its reply (`yield_writing/better_claim`: {} \
times). A claim that a lossy link dropped comes on a retry, so the bot waits for the acknowledgement of every \
peer whose link works, past `claim_ack_timeout_ms` (up to four times it); only a peer whose link has failed for \
the whole timeout is not waited for ({} posts went out that way, `post/claim_unacked`; none made a duplicate). \
The price is the ranking under loss: when the more relevant bot's claim is the late one, the less relevant bot \
may commit first and answer alone{}.",
            reason("yield_writing/already_answered"),
            reason("yield_writing/better_claim"),
            reason("post/claim_unacked"),
            network.map_or(String::new(), |p| format!(
                " (right bot first in the network group: {p:.1}%)"
            ))
        );
    }

    // Right bot first, per group.
    let weak: Vec<String> = r
        .groups
        .iter()
        .filter_map(|g| {
            let m = g.get(PolicyKind::Botmesh)?;
            let right = m.right_bot_first_pct?;
            (right < 95.0).then(|| {
                format!(
                    "{} {right:.1}% (unanswered {:.1}%)",
                    g.name,
                    m.unanswered_pct.unwrap_or(0.0)
                )
            })
        })
        .collect();
    if !weak.is_empty() {
        let _ = writeln!(
            d,
            "- Groups where botmesh's right-bot-first rate is below 95%: {}.",
            weak.join("; ")
        );
    }
    let words = reason("withdraw/after_judging");
    let _ = writeln!(
        d,
        "- A slow judge keeps its rank: a node whose judge about the trigger is still out (or that has not applied \
its rules to it yet) answers a peer's claim `judging`, and the claimant waits for that node's word before it \
commits — its claim (then it stands by behind a better one) or, if it declines, a withdrawal sent to the claimants \
alone ({words} such withdrawals over all runs: one envelope to a waiting claimant, never a round per bot). \
`network-en-slow-judge` shows it: {}% right bot first with heavy-tailed judge latency. Words that never came in \
`judge_word_timeout_ms`: {}.",
        r.scenarios
            .iter()
            .find(|s| s.name == "network-en-slow-judge")
            .and_then(|s| s.get(PolicyKind::Botmesh))
            .and_then(|m| m.right_bot_first_pct)
            .map_or("–".to_string(), |p| format!("{p:.1}")),
        reason("post/judge_word_missing")
    );
    let withdrawn = reason("withdraw/claim");
    if withdrawn > 0 {
        let _ = writeln!(
            d,
            "- A yield is not final: a winner that fails to answer after others stood by behind its claim (reply call \
failed, re-judge declined, a hard rule at the last check) withdraws it ({withdrawn} withdrawals over all runs), and \
the best bot still standing by re-enters after a grace of a quarter of its delay ({} re-entries); a reply it wrote \
while standing by that failed is written once more now that it has the turn. botmesh leaves \
{:.1}% of the questions that needed an answer unanswered overall{}: what remains are runs where the calls \
(judge or reply) of every relevant bot failed. When the best bot's call fails and the next best answers, the \
question is answered but not by the most relevant bot, which is why the failures group stays below 95% on \
\"right bot first\" (`--trace failures-en-winner-fails`).",
            reason("resume/claim_withdrawn"),
            bm.unanswered_pct.unwrap_or(0.0),
            r.groups
                .iter()
                .find(|g| g.name == "failures")
                .and_then(|g| g.get(PolicyKind::Botmesh))
                .and_then(|m| m.unanswered_pct)
                .map_or(String::new(), |u| format!(" and {u:.1}% in the failures group"))
        );
    }

    // The misses at seed 13, and what fixed them.
    let _ = writeln!(
        d,
        "- Two misses at seed 13 had causes in the turn code, both fixed there. (1) `failures-en-winner-fails`: a \
runner-up writes its reply while it stands by behind the winner; when that early reply call failed and the winner's \
reply failed too, the runner-up re-entered, found its early call failed and gave up (`silent/reply_failed`), leaving \
a question unanswered that it was the fallback for. Writing early is ahead of the turn, so its failure is no longer \
the turn's: the bot that has the turn writes once more. (2) `network-zh-claim-drops` under botmesh-drafting: the best \
bot's claim to a peer was lost on retry after retry for 15 s while the peer's claim had reached it; the peer, told \
`judging`, waited for a word that was stuck on the same link and went ahead (`post/judge_word_missing`), and the \
best bot, after four `claim_ack_timeout_ms`, posted unacknowledged (`post/claim_unacked`): two answers. A bot whose \
claim a peer never acknowledged, but whose peer's own claim on the trigger is on its board, now knows that peer \
goes ahead without it and yields to it instead (`yield_writing/unheard_by_claimant`: {} times over all runs); \
should the peer's turn fail, its withdrawal comes over the link that brought its claim.",
        reason("yield_writing/unheard_by_claimant")
    );

    // Agent bots.
    if let Some(agents) = r.groups.iter().find(|g| g.name == "agents") {
        if let Some(a) = agents.get(PolicyKind::Botmesh) {
            let nano = agents.get(PolicyKind::Nanobot);
            let _ = writeln!(
                d,
                "- Agent bots (the `agents` group: a coding agent's turn takes from 10 s to 10 min, \
drawn from the seeded generator on the paused clock): a bot holds its claim while its agent works, so its colleagues \
stand by for as long as its `turn_timeout_secs` (the `[[bots]] agent` setting every node reads from peers.toml) \
instead of the two minutes after which they give up on a model bot's claim, and re-enter when it withdraws. In the \
group, botmesh: {:.3} duplicates per human message, right bot first {}, unanswered {}; {} progress events, {} agent \
crashes mid-turn (each followed by a colleague's answer: the crashed exchange's right bot is the next most relevant), \
{} turns dropped by `/stop` (`silent/stopped`) and {} answers to a stopped request (nanobot, which has no `/stop`: {}; \
duplicates {}). A request that addresses a busy agent waits for the agent's next turn, holding the turn meanwhile, \
and is answered by it. Before colleagues knew an agent's turn limit, a claimant whose agent died after more than two \
minutes left its question unanswered: the colleagues had given up standing by. The first-answer times over all \
scenarios include these turns of minutes (hence a p95 of minutes); the per-group table gives each group's own.",
                a.dup_per_human_msg,
                opt_pct(a.right_bot_first_pct),
                opt_pct(a.unanswered_pct),
                a.progress_events,
                a.agent_crashes,
                reason("silent/stopped"),
                a.unwanted_answers,
                nano.map_or(0, |n| n.unwanted_answers),
                nano.map_or("–".to_string(), |n| format!("{:.3}", n.dup_per_human_msg)),
            );
            if a.asks > 0 {
                let _ = writeln!(
                    d,
                    "- Agents asking a colleague mid-turn (`agent-*-ask-colleague`, the `ask` tool as it is on the \
wire): {} questions asked, {} answers handed back to the waiting ask (none starting a turn of the asker), {} bot \
messages replying to the questions (one per question: the colleague answered once and nobody else did), {} asking \
turns that went on to post their answer (the rest would be orphaned).",
                    a.asks, a.asks_answered, a.ask_replies, a.ask_turns_finished,
                );
            }
        }
    }

    // LLM calls.
    let cheaper: Vec<&PolicyMetrics> = r
        .overall
        .policies
        .iter()
        .filter(|p| {
            !p.policy.is_botmesh()
                && p.metrics.llm_calls_per_human_msg <= bm.llm_calls_per_human_msg
        })
        .collect();
    if !cheaper.is_empty() {
        let names: Vec<String> = cheaper
            .iter()
            .map(|p| {
                format!(
                    "{} {:.2} ({:.2} judge on bot messages, {:.2} replies)",
                    p.policy.as_str(),
                    p.metrics.llm_calls_per_human_msg,
                    p.metrics.judge_bot_per_msg,
                    p.metrics.reply_per_msg
                )
            })
            .collect();
        let _ = writeln!(
            d,
            "- Why botmesh is not the cheapest: every bot reply is judged by every other bot it does not address \
(`interject_check` applies to bot messages too when `reply_to = \"all\"`), so each bot message costs up to n − 1 \
judge calls: {:.2} per human message here, plus {:.2} re-judges. Cheaper: {}. Those baselines never judge \
unmentioned bot messages, so they can never interject on them either. Without the judge calls on bot messages \
botmesh would make {:.2} calls per human message.",
            bm.judge_bot_per_msg,
            bm.rejudge_per_msg,
            names.join("; "),
            bm.llm_calls_per_human_msg - bm.judge_bot_per_msg
        );
    }
    if r.overall
        .policies
        .iter()
        .all(|p| p.metrics.reply_per_msg >= bm.reply_per_msg)
    {
        let _ = writeln!(
            d,
            "- botmesh makes the fewest reply calls ({:.2} per human message): it saves on replies and spends on judging.",
            bm.reply_per_msg
        );
    }
    let _ = writeln!(
        d,
        "- Local filters saved {} judge calls on acknowledgements and {} on messages addressed to someone else (over all runs).",
        reason("silent/acknowledgement"),
        reason("silent/addressed_to_other")
    );
    let ablation = |prefix: &str| r.ablations.iter().find(|a| a.name.starts_with(prefix));
    let group_p50 = |group: &str, policy: PolicyKind| {
        r.groups
            .iter()
            .find(|g| g.name == group)
            .and_then(|g| g.get(policy))
            .and_then(|m| m.ttfa_p50_ms)
            .map_or("–".to_string(), |v| v.to_string())
    };
    let p50 = |m: &Metrics| m.ttfa_p50_ms.map_or(0, |v| v as i64);
    if let (Some(nb), Some(off)) = (
        r.overall.get(PolicyKind::Nanobot),
        ablation("no writing while waiting"),
    ) {
        let _ = writeln!(
            d,
            "- Writing while waiting: a bot starts its reply as it claims (when no better claim is on its board) and posts \
at the later of its delay's end and its reply; a yield cancels the request or throws the text away \
(`botmesh_replies_discarded_total`). Turned off (`write_early = false`), the median first answer is {} ms instead of {} ms \
and the LLM calls {:.2} instead of {:.2} per human message ({:.2} replies written and thrown away). Its median first \
answer still comes {} ms after nanobot's: nanobot's first answer is the fastest of every bot that judged \
\"yes\" (in the collision group, the quickest of several independent judge + reply latencies), botmesh's is the \
most relevant bot's own judge and reply; in the single-bot groups the two are level (see the per-group table).",
            p50(&off.metrics),
            p50(bm),
            off.metrics.llm_calls_per_human_msg,
            bm.llm_calls_per_human_msg,
            bm.discarded_per_msg,
            p50(bm) - p50(nb),
        );
    }
    let kb = |m: &Metrics| m.prompt_bytes_per_human_msg.unwrap_or(0.0) / 1000.0;
    if let (Some(nb), Some(dr)) = (
        r.overall.get(PolicyKind::Nanobot),
        r.overall.get(PolicyKind::BotmeshDrafting),
    ) {
        let _ = writeln!(
            d,
            "- The drafting judge (`judge_drafts = true` on every bot: the botmesh-drafting rows): a bot's judge call is one streamed call to its reply model whose first line is the verdict and whose rest is the reply, so the reply is written from the moment the message arrives instead of from the verdict; a bot that declines stops after the verdict line, and one behind a better claim drops the call. Median first answer {} ms instead of {} ms (nanobot {} ms), {:.2} LLM calls per human message instead of {:.2} (an interjection needs no reply call of its own), {:.3} duplicates, right bot first {}, unanswered {}; {:.2} drafts per human message were written and then thrown away. The price is input and the model: the call's prompt is the reply's plus the judge's question ({:.0} bytes on average against {:.0} for the judge's alone), every bot that judges a message sends it, and the reply model does the judging. The prompts of all calls come to {:.1} KB per human message against {:.1} KB with separate judge and reply calls ({:.1} KB with the shared judge). In the model, the verdict line comes after the judge's latency and the draft at the later of that and the reply's own latency (the reply's latency already includes the wait for its first token).",
            p50(dr),
            p50(bm),
            p50(nb),
            dr.llm_calls_per_human_msg,
            bm.llm_calls_per_human_msg,
            dr.dup_per_human_msg,
            opt_pct(dr.right_bot_first_pct),
            opt_pct(dr.unanswered_pct),
            dr.discarded_per_msg,
            dr.judge_prompt_bytes_mean.unwrap_or(0.0),
            bm.judge_prompt_bytes_mean.unwrap_or(0.0),
            kb(dr),
            kb(bm),
            r.overall
                .get(PolicyKind::BotmeshShared)
                .map_or(0.0, kb),
        );
    }
    if let Some(off) = ablation("no waiting for a judging peer") {
        let _ = writeln!(
            d,
            "- Waiting for a judging peer's word, turned off (`judge_word_timeout_ms = 0`): right bot first {} instead of {}, \
for {} ms of median first answer.",
            opt_pct(off.metrics.right_bot_first_pct),
            opt_pct(bm.right_bot_first_pct),
            p50(bm) - p50(&off.metrics),
        );
    }
    if let Some(off) = ablation("no claim acknowledgements") {
        let _ = writeln!(
            d,
            "- Claim acknowledgements, turned off (`claim_ack_timeout_ms = 0`): {:.3} duplicate interjections per human \
message instead of {:.3} ({:.1}% of runs with one): without them a claim that is late in transit can reach a peer \
after that peer answered.",
            off.metrics.dup_per_human_msg,
            bm.dup_per_human_msg,
            off.metrics.runs_with_dup_pct,
        );
    }
    if let Some(sh) = r.overall.get(PolicyKind::BotmeshShared) {
        let _ = writeln!(
            d,
            "- The shared judge (`[mesh] judge = \"shared\"`): one bot per message, chosen from the message id, asks once \
for every bot whose rules say judge, and broadcasts the answers as a signed `verdict`; {:.2} LLM calls per human \
message instead of {:.2} ({:.2} judge calls instead of {:.2}), {:.3} duplicates, right bot first {}, unanswered {}, \
median first answer {} ms ({} ms more than with every bot's own judge: the verdict travels one more network hop). \
Knowing the whole ranking, a bot that the verdict puts behind a colleague does not write early, so hardly a reply \
is thrown away ({:.2} per human message); the price is in the failures group, where the runner-up only starts \
writing once the winner's reply has failed (unanswered {} there against {} with own judges). What a team gives up: \
per-bot `judge_prompt`s do not apply, and one model call ranks everyone. Its first answer cannot come before \
nanobot's within two calls per message: it is one judge call, one network hop for the verdict, then the winner's \
reply, where a nanobot bot that does not wait answers after its own judge and reply (in the single-bot groups \
{} ms against nanobot's {} ms), and in a collision the quickest of several does. Writing before the verdict would \
take a speculative reply call from bots that then stay silent, for which two calls per message leave no room.",
            sh.llm_calls_per_human_msg,
            bm.llm_calls_per_human_msg,
            sh.judge_human_per_msg + sh.judge_bot_per_msg + sh.rejudge_per_msg,
            bm.judge_human_per_msg + bm.judge_bot_per_msg + bm.rejudge_per_msg,
            sh.dup_per_human_msg,
            opt_pct(sh.right_bot_first_pct),
            opt_pct(sh.unanswered_pct),
            p50(sh),
            p50(sh) - p50(bm),
            sh.discarded_per_msg,
            r.groups
                .iter()
                .find(|g| g.name == "failures")
                .and_then(|g| g.get(PolicyKind::BotmeshShared))
                .map_or("–".into(), |m| opt_pct(m.unanswered_pct)),
            r.groups
                .iter()
                .find(|g| g.name == "failures")
                .and_then(|g| g.get(PolicyKind::Botmesh))
                .map_or("–".into(), |m| opt_pct(m.unanswered_pct)),
            group_p50("single", PolicyKind::BotmeshShared),
            group_p50("single", PolicyKind::Nanobot),
        );
    }
    let _ = writeln!(
        d,
        "- Two rules keep judge calls off answers nobody needs to weigh: a bot re-judges after its wait only when other \
bots spoke in the trigger's own thread (new questions from people are judged as they come, and answers in other \
threads say nothing about this one: before, in `burst`, every bot threw its early text away and judged and wrote \
again whenever the next question arrived), and a bot that a message did not address (`addressed_to_other`) passes \
on the exchange that follows it (`passed_on_thread`), as it does on what it declined."
    );
    if let Some(c) = bm.want_all_coverage_pct {
        let _ = writeln!(
            d,
            "- On messages that ask everyone to speak (\"大家都说说\", \"@all\", \"everyone, …\": `policy::asks_everyone`, an \
explicit list), botmesh lets {c:.1}% of the bots with something to say speak, staggered by relevance and still under \
`max_depth` and the group's rate cap; claims order the answers but make nobody yield, and the answers in the round \
cost no judge call of their own (`judge/everyone_asked`: {} turns).",
            reason("judge/everyone_asked")
        );
    }
    d
}

pub(super) const DOC_METHOD: &str = r#"## What is simulated

`botmesh simulate` runs in virtual milliseconds, so one seed gives one result. Each scenario names 3–8 bots, human
messages at given times, what each bot's judge LLM would answer about each message (`speak` and
`relevance`, optionally a different answer once the judge's prompt already shows another bot's answer),
reply texts (which may @mention other bots, so bots talk to bots), LLM latency distributions for judge
and reply calls, and network delay/drop (global or per link, with a separate claim drop rate).
Every message, the humans' and the bots', is delivered to each node with its own delay, so each node
has its own transcript and its own view of claims.

The network is the real outbox's: one delivery task per peer, sending one envelope at a time and in
order (claims share the queue with messages), each waiting for the previous one's answer. A "drop"
is a failed attempt, not a lost envelope: the sender notices after a round trip and retries after
`RetryPolicy::backoff` (from `retry_base_ms` 200, doubling up to `retry_max_ms`, jitter in [d/2, d]),
drawing loss and delay afresh, until it gets through. (Before this model, the simulator dropped
claims outright, which the real mesh never does: a dropped claim there is a late one.) Relaying
around a broken link is not modelled.

Under the botmesh policy every bot runs the production turn code itself: each simulated node is a
`turn::Ports` (the same trait the real node implements) on tokio's paused clock, and each message it
receives goes through `turn::triage` and `turn::act` exactly as on a node (`Node::after_append`). So
the mention matcher, `policy::decide` and `policy::last_check`, `judge::build_prompt` (whose length in
bytes is what the tables report), `scheduler::delay_for` (its jitter drawn from the run's seeded
generator through `Ports::jitter_ms`), each node's own `scheduler::ClaimBoard` and its `wait`, the
claim acknowledgements (`egress::acks::AckTracker`, `ClaimAcks::wait`), `ClaimBoard::commit`, the
re-judge, the withdrawals and every decision's reason are the real ones. The `Ports` of a simulated
node only carries things: its transcript, the clock, the scripted LLM (judge verdicts and reply texts
after sampled latencies, failing at the scenario's rates) and the network above, on which each peer's
answer to a claim travels back one network delay after the delivery and carries what the receiving
node's board says at that moment (`Brain::answering`, as the bridge answers). The baselines are a
discrete-event loop over the same network, mention matcher, judge prompts and scripts.

A bot may be an agent bot (`agent = { min_secs, max_secs }`): its reply engine is a coding agent, as
with `[[bots]] agent = { acp = … }` on a node. The agent is handed the turn only once the bot is to
speak (it writes nothing while it waits, and a drafting judge never writes for it); its turn lasts a
time drawn uniformly from the range with the run's seeded generator (10-minute turns cost no wall time
on the paused clock), sends a progress event (`Event::Progress`, as the ACP engine's turn does) every
`progress_secs`, and runs one at a time: a request that reaches an agent at work waits for its next
turn, the bot holding the turn meanwhile. A person's `/stop` is carried out as the node's command
handler does (`GroupStops::stop`: the group's turns in flight drop, `silent/stopped`). A message's
`crash = ["Bot"]` makes that agent die halfway through its turn on the exchange: the turn code sees the
failure and ends the turn silent (`silent/reply_failed` here; on a node the ACP engine records it as
`agent_failed`), withdrawing its claim; the agent works again for its later turns. Every node is
given the agent bots' `[[bots]] agent` settings, so the colleagues know how long such a bot may hold the
turn (`turn_timeout_secs`, here `max_secs`). The baselines see an agent bot as a bot whose reply takes
that long; they have no `/stop`.

An agent may ask a colleague mid-turn (a scenario message's `ask = { Coder = { colleague, question,
after_secs } }`: the `ask` group tool, docs/agents.md "Working together"). It is modelled as it is on
the wire: `after_secs` into its turn the agent bot publishes its own message "@colleague question",
replying to the turn's trigger and one deeper, through the same network as every message, while its turn
stays in flight; beforehand it registers the wait in the node's own `turn::asks` (`Asks::expect`), and
every node offers each arriving bot message to it first (`Asks::offer`, as `app::group_tools` does on a
node), so the colleague's answer goes back to the waiting ask and starts no turn of the asker. The
colleague decides about the question as about any mention. The agent's turn is longer by the time it
waited (at most `ask_timeout_secs`), then it ends and posts its answer. The baselines have no ask.

Defaults unless a scenario says otherwise: `max_depth = 3`, `llm_threshold = 1`, 6 bot messages a
minute, delays 1000–3000 ms with 150 ms jitter, `min_relevance = 0.3`, 8 messages of judge context;
judge latency U(400–1200) ms, reply latency log-normal (median 2500 ms, σ 0.35, ≤ 20 s), network
U(20–150) ms, no failed deliveries, no LLM failures (a failed call means silence); a run ends 60 s (virtual) after the last human message, or at 200 bot messages.

## The policies

| policy | follows | on a human message | on a bot message | delay and collisions | loop brake |
|---|---|---|---|---|---|
| **botmesh** | docs/design.md, "What a node does with each message"; the real code | mentioned → reply at once; addressed to someone else / acknowledgement → silent; else judge → claim → wait `min + (1 − r)(max − min)` + jitter | same rules (mentioned at depth > `llm_threshold` → judge first) | stands by behind a better claim, re-enters if it is withdrawn, yields once the trigger is answered; re-judges once if other bots spoke in the trigger's thread meanwhile; posts only once every peer acknowledged its claim (or after `claim_ack_timeout_ms`) and none answered, committing atomically; on a message to everyone nobody yields | `depth ≥ max_depth` never; per-group bot message cap |
| **botmesh-shared** | the same code with `[mesh] judge = "shared"` | as botmesh, but one bot per message (chosen from its id) asks the judge once for every bot whose rules say judge and broadcasts the answers as a `verdict`; each bot applies its own entry (or judges itself if none comes in `verdict_timeout_ms`) | same | as botmesh; a bot that the verdict ranks behind a colleague does not write while it waits | as botmesh |
| **botmesh-drafting** | the same code with `judge_drafts = true` on every bot | as botmesh, but each bot's judge call is one streamed call whose first line is the verdict and whose rest is the reply: the bot claims and waits on the verdict while the reply goes on being written; one that declines stops after the verdict line | same | as botmesh; the draft is the reply written while waiting (dropped behind a better claim) | as botmesh |
| **xiaoba** | seed 004 (XiaoBa bot2bot bridge, P0 judge) as docs/design.md describes it, and the weaknesses listed there ("random 1–3 s delays that let two bots answer the same question", "LLM-only loop guards") | mentioned → full reply at once ("被@则触发推理"); else judge with the last 10 messages | every broadcast is judged the same way | uniform random 1–3 s; silent if any bot broadcast arrived during the wait; no check after writing | none but the LLM (seed 004 §四.2: "两个 bot 互相@会无限循环") |
| **nanobot** | seed 000 (Feishu relay, stop policy §4), seed 001 (transcript `get_recent(20)` for the relevance check) | mentioned → reply; else `_check_relevance` (judge) → reply; no delay | not mentioned → ignored (never interjects on bots); mentioned → depth = trailing bot messages in the transcript incl. this one: `≥ max` reject, `≤ threshold` reply, else LLM YES/NO | none: everyone who passes replies at once | the depth rule above (`max_bot_reply_depth` 3, `bot_reply_llm_threshold` 1: same numbers as botmesh) |
| **review-panel** | seed 002 (review panel protocol §3.1, §4.1, §8.1) | `should_respond` (judge on the message alone) → random 2–4 s (`reaction_delay: random(2, 4)`) → reply; mentioned → reply after the delay without judging | ignored, no LLM call (`finish()`) | none: every judge that says yes speaks | ignoring bots |

Seed 004's P0 plan goes further than the XiaoBa baseline: relevance-scaled delays ("相关度高的延迟短") and a
re-judge after seeing the other bot's reply. That plan is what botmesh implements (and extends with
claims); the baseline is the bridge as docs/design.md and its weakness list describe it.

The scripted judge answers the same for every policy (the scenario's `judge` / `bot_judge` tables),
and its answer depends only on what its prompt shows: if the prompt's context already contains
another bot's reply to the message, the `after_answer` entry applies (by default: decline); a bot
message that @mentions another bot is declined by every judge but the mentioned bot's. Where a
baseline's source leaves a detail open, the simulator picks the reading that favours the baseline:
XiaoBa's judge sees replies that arrived before it was asked (so it can decline); the review panel
skips the judge when mentioned. Every policy uses the same mention matcher, latencies and network.

## The measures

- **duplicate interjections per human message**: for every message (human or bot) where one answer
  suffices, the answers by bots it did not mention, beyond the first (or all of them, if a mentioned bot
  answered); summed and divided by the number of human messages. Messages marked `want = "all"`
  ("大家都说说") are excluded; for them the tables give **"everyone" coverage**, the share of bots
  with something to say (judge `speak`) that did speak.
- **right bot first**: of the one-answer human messages that need an answer (someone is mentioned, or
  some bot's judge says `speak`), the share whose first answer came from the mentioned bot or, if none
  is mentioned, from the bot with the highest scripted relevance. **unanswered**: the share that got
  no answer at all.
- **first answer p50 / p95**: virtual ms from a human message to the first bot reply to it.
- **longest bot chain**: the deepest bot message, in bot turns since the last human message (a reply
  to a message of depth d has depth d + 1). "N+ (k runaway)" means k runs were stopped at 200 bot
  messages, so the chain could have gone on.
- **LLM calls per human message**: judge calls (including botmesh's re-judge) plus reply calls, over
  human messages. A reply call whose text is thrown away at the last check still counts.
- **judge prompt bytes**: the mean UTF-8 size of every judge prompt built. For botmesh it is the real
  `judge::build_prompt` output with the bot's 8-message context (each message trimmed to 240 chars).
  The baselines' prompts are estimates, built with the same function from a template written after
  their descriptions (the templates are `XIAOBA_JUDGE_PROMPT`, `NANOBOT_JUDGE_PROMPT` and
  `PANEL_JUDGE_PROMPT` in `node/src/simulate/policy.rs`):
  - XiaoBa (seed 004 P0 + P1): the bot's profile, the colleague table (P1 puts it in the prompt),
    the last **10** messages untrimmed (the seed says 5–10; 10 is the upper end) and the new one,
    answer yes/no.
  - nanobot (seed 000 §4.4 + seed 001): the role, the last **20** transcript messages untrimmed
    (`get_recent(max_messages=20)`) and the new one, answer YES/NO. No colleague profiles.
  - review panel (seed 002 §8.1 + §4.1): the judge's instruction block and the message alone (the
    panel keeps no history), answer yes/no.
"#;

pub(super) const DOC_FORMAT: &str = r#"
## Scenario files

`scenarios/*.toml`, one scenario each (`botmesh simulate --scenarios DIR` reads another folder):

```toml
group = "collision"            # results are also reported per group
lang = "zh"                    # language of the synthetic replies
description = "…"
[mesh]                         # optional: any [mesh] key of peers.toml
max_depth = 3
[timing]                       # optional; distributions: fixed {ms}, uniform {min,max}, lognormal {median,sigma,max}
judge = { dist = "uniform", min = 400, max = 1200 }
reply = { dist = "lognormal", median = 2500, sigma = 0.35, max = 20000 }
network = { dist = "uniform", min = 20, max = 150 }
drop = 0.0                     # failed delivery attempts of bot messages (retried with backoff)
claim_drop = 0.0               # failed delivery attempts of claims (retried with backoff)
judge_fail = 0.0               # judge calls that fail or time out (silence)
reply_fail = 0.0               # reply calls that fail or time out (silence)
[[links]]                      # optional per-direction overrides; "*" matches anyone
from = "XiaoBa"
to = "*"
claim_drop = 0.5
[[bots]]
name = "XiaoBa"
aliases = ["小八"]
role = "研发助手"
skills = ["论文阅读", "代码编写"]
settings = { min_delay_ms = 1000 }   # optional: any [[bots]] key of peers.toml
[[bots]]
name = "Coder"
agent = { min_secs = 10, max_secs = 600, progress_secs = 30 }  # a coding agent: turns of 10 s–10 min
[[messages]]
at = 0                         # virtual ms
from = "老师"                   # a human
text = "有人读过 Raft 那篇论文吗？"
want = "one"                   # or "all", or "none" (a person /stops the turn it starts)
judge = { XiaoBa = 0.9, ErGoz = 0.6, Lina = { speak = false, relevance = 0.2 } }
after_answer = { ErGoz = 0.2 } # once the prompt shows another bot's answer (default: decline)
reply = { XiaoBa = "读过。@ErGoz 实现上你怎么看？" }
bot_judge = { ErGoz = 0.3 }    # about bot messages in this exchange (default: no; 0.7 if mentioned)
bot_reply = { ErGoz = ["…", "…"] }   # successive replies to bot messages in this exchange
crash = ["Coder"]              # agent bots whose agent dies mid-turn on this message
[[messages]]
at = 45000
from = "老师"
text = "/stop"                 # a person's command: carried out, never judged
```
"#;
