//! People's control of the bots in the chat. Their commands: `/quiet`, `/resume`, `/stop`, `/why`, and
//! `/allow`, `/deny` (answers to an ACP agent's permission question), addressed
//! to one bot (`/why @Alice`, `@Alice /why`) or, without a bot's @, to every bot.
//!
//! A command is a *person's* chat message whose text, after the @mentions in front of
//! it (as the platform delivers them: `@Name`, `@_user_1`, `<at …>…</at>`), starts with
//! `/` (or the full-width `／`) and one of the verbs, in any case. A bot's text
//! never is one, and an unknown `/foo` is ordinary text. With `[mesh] operators` set,
//! `/quiet`, `/resume` and `/stop` are commands only from an operator ([`may_command`]);
//! anyone else's is ordinary text. `/why` is open to everyone; `/allow` and `/deny`
//! to the person whose message started the agent's turn and operators
//! (`turn::approval`). Commands are recorded
//! in the transcript like any message, but never judged or answered, and
//! [`without_commands`] keeps them (and the bots' `/why` answers to them) out of
//! every LLM prompt.
//!
//! This module parses, and keeps what the commands act on inside the turn code:
//! [`Quiet`] (the operator's node-wide switch and each group's), [`GroupStops`] (each
//! group's stop token, cancelled by `/stop`) and [`Trail`] (the decisions about
//! recent messages, which `/why` reads back). The node carries the commands out
//! (`app::commands`).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::config::names::person_key;
use crate::config::Platform;
use crate::turn::mention::{MentionMatcher, PlatformMention};
use crate::turn::tuning::Tuning;
use crate::wire::envelope::{AuthorKind, Envelope, Kind};
use crate::wire::ids::IdMap;

/// What a person asks of the bots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    /// `/quiet`: the group's quiet switch on (`POST /v1/quiet` with its `group`).
    Quiet,
    /// `/resume`: the group's quiet switch off.
    Resume,
    /// `/stop`: drop the turns in flight for the group and withdraw their claims.
    Stop,
    /// `/why`: say why the bot did or did not speak on the last message.
    Why,
    /// `/allow`: allow the tool call the bot's ACP agent asked about (the question
    /// replied to, else the most recent one waiting in the group; `turn::approval`).
    Allow,
    /// `/deny`: reject it.
    Deny,
}

impl Verb {
    /// The label in logs and `botmesh_chat_commands_total{command}`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verb::Quiet => "quiet",
            Verb::Resume => "resume",
            Verb::Stop => "stop",
            Verb::Why => "why",
            Verb::Allow => "allow",
            Verb::Deny => "deny",
        }
    }
}

/// Whom a command addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// No bot was @-mentioned: every bot.
    All,
    /// These bots (canonical names), @-mentioned in the command.
    Bots(Vec<String>),
}

/// A person's command, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Command {
    /// What is asked.
    pub verb: Verb,
    /// Of whom.
    pub target: Target,
}

impl Command {
    /// Whether the command addresses bot `me`.
    pub(crate) fn addresses(&self, me: &str) -> bool {
        match &self.target {
            Target::All => true,
            Target::Bots(names) => names.iter().any(|n| n == me),
        }
    }
}

/// The verb `text` commands, if it is a command: leading @mentions skipped, then `/`
/// or `／` and a known verb (ASCII, any case) that no letter or digit continues.
pub(crate) fn verb_of(text: &str) -> Option<Verb> {
    let mut s = text.trim_start();
    loop {
        if let Some(rest) = s.strip_prefix('@').or_else(|| s.strip_prefix('＠')) {
            // `@Name`, `@_user_1`, `@小八`: up to a space or the command's slash.
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '/' || c == '／')
                .unwrap_or(rest.len());
            s = rest[end..].trim_start();
        } else if s.starts_with("<at ") {
            // A platform mention tag of someone outside the mesh (Feishu, Discord).
            let end = s.find("</at>")?;
            s = s[end + "</at>".len()..].trim_start();
        } else {
            break;
        }
    }
    let rest = s.strip_prefix('/').or_else(|| s.strip_prefix('／'))?;
    let len = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    match rest[..len].to_ascii_lowercase().as_str() {
        "quiet" => Some(Verb::Quiet),
        "resume" => Some(Verb::Resume),
        "stop" => Some(Verb::Stop),
        "why" => Some(Verb::Why),
        "allow" => Some(Verb::Allow),
        "deny" => Some(Verb::Deny),
        _ => None,
    }
}

/// The verb of `env` if it reads as a person's command (only people command: a bot's
/// text that looks like one is ordinary text), whoever the person is.
pub(crate) fn verb_of_person(env: &Envelope) -> Option<Verb> {
    if env.kind == Kind::Message && env.author.kind == AuthorKind::Human {
        verb_of(&env.text)
    } else {
        None
    }
}

/// Whether `env` is a person's command that is carried out: `/why` from anyone, the
/// others from an operator ([`may_command`]). Anything else is ordinary text.
pub(crate) fn is_command(env: &Envelope, t: &Tuning) -> bool {
    verb_of_person(env).is_some_and(|verb| may_command(verb, env, t))
}

/// Who the person who wrote `env` is, as `[mesh] operators` names people: the
/// platform of the node that carries the message (this bot, or the colleague that
/// signed it) and the person's ids there — on `local` the name they post under,
/// elsewhere the platform's ids in the envelope's `person` (space-separated: Feishu
/// gives a per-app open_id and a per-developer union_id). A colleague is believed only
/// about its own platform's people. Empty: no person, or no id.
pub(crate) fn person_of(env: &Envelope, t: &Tuning) -> Vec<String> {
    if env.author.kind != AuthorKind::Human {
        return Vec::new();
    }
    if env
        .author
        .name
        .starts_with(crate::config::a2a::CALLER_PREFIX)
    {
        // An A2A caller (`a2a:hermes`): named so in `[mesh] operators`. Only a node
        // serving it posts under that name (the local API refuses it to people).
        return vec![env.author.name.clone()];
    }
    let carrier = if env.sender == t.me.name {
        Some(&*t.me)
    } else {
        t.colleagues.iter().find(|b| b.name == env.sender)
    };
    match carrier.map(|c| c.platform) {
        None => Vec::new(),
        Some(Platform::LOCAL) => vec![person_key(Platform::LOCAL, &env.author.name)],
        Some(platform) => env
            .person
            .iter()
            .flat_map(|ids| ids.split_whitespace())
            .map(|id| person_key(platform, id))
            .collect(),
    }
}

/// Whether `verb`, said in `env`, is carried out: `/why` always; `/allow` and `/deny`
/// always reach the question (`turn::approval` decides who may answer it: the
/// requester or an operator); `/quiet`, `/resume` and `/stop` when `[mesh] operators`
/// is absent (everyone commands) or names the person ([`person_of`]).
pub(crate) fn may_command(verb: Verb, env: &Envelope, t: &Tuning) -> bool {
    match (&t.mesh.operators, verb) {
        (_, Verb::Why | Verb::Allow | Verb::Deny) | (None, _) => true,
        (Some(operators), _) => person_of(env, t).iter().any(|p| operators.contains(p)),
    }
}

/// Parses what reads as a person's command (whoever the person: [`may_command`] says
/// whether it is carried out); its targets are the bots @-mentioned anywhere in it
/// (`matcher`, with the platform's mention list), none meaning every bot.
pub(crate) fn parse(
    env: &Envelope,
    matcher: &MentionMatcher,
    platform: &[PlatformMention],
) -> Option<Command> {
    let verb = verb_of_person(env)?;
    let names = matcher.mentioned(&env.text, platform);
    let target = if names.is_empty() {
        Target::All
    } else {
        Target::Bots(names)
    };
    Some(Command { verb, target })
}

/// `msgs` without the people's commands and the bots' answers to them (a `/why`
/// answer replies to its command): what an LLM prompt's context is built from.
pub(crate) fn without_commands(msgs: Vec<Arc<Envelope>>, t: &Tuning) -> Vec<Arc<Envelope>> {
    without_commands_after(&[], msgs, t)
}

/// [`without_commands`] for `msgs` that follow `earlier`: an answer in `msgs` to a
/// command among `earlier` goes too.
pub(crate) fn without_commands_after(
    earlier: &[Arc<Envelope>],
    msgs: Vec<Arc<Envelope>>,
    t: &Tuning,
) -> Vec<Arc<Envelope>> {
    let commands: Vec<Ulid> = earlier
        .iter()
        .chain(&msgs)
        .filter(|e| is_command(e, t))
        .map(|e| e.id)
        .collect();
    if commands.is_empty() {
        return msgs;
    }
    msgs.into_iter()
        .filter(|e| !commands.contains(&e.id) && !e.reply_to.is_some_and(|r| commands.contains(&r)))
        .collect()
}

/// The quiet switches: the operator's, node-wide (`POST /v1/quiet`, `botmesh quiet`,
/// the bot's `quiet` key), and each group's (a person's `/quiet` and `/resume` there,
/// or `POST /v1/quiet` with a `group`). The bot takes no turns in a group while
/// either is on.
#[derive(Default)]
pub(crate) struct Quiet {
    /// The node-wide switch.
    node: AtomicBool,
    /// The groups switched quiet on their own.
    groups: Mutex<BTreeSet<String>>,
}

/// Which switch keeps a group quiet, for `/why` and the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuietBy {
    /// Neither: the bot takes turns.
    Off,
    /// The group's own switch (a person's `/quiet`): `/resume` there lifts it.
    Group,
    /// The node-wide switch: only the operator lifts it.
    Node,
}

impl Quiet {
    /// Starts with the node-wide switch at `on`.
    pub(crate) fn new(on: bool) -> Quiet {
        Quiet {
            node: AtomicBool::new(on),
            groups: Mutex::default(),
        }
    }

    /// Sets the node-wide switch; returns what it was.
    pub(crate) fn set_node(&self, on: bool) -> bool {
        self.node.swap(on, Ordering::Relaxed)
    }

    /// Sets `group`'s own switch; returns what it was.
    pub(crate) fn set_group(&self, group: &str, on: bool) -> bool {
        let mut groups = self.groups.lock();
        if on {
            !groups.insert(group.to_string())
        } else {
            groups.remove(group)
        }
    }

    /// Whether the node-wide switch is on.
    pub(crate) fn node(&self) -> bool {
        self.node.load(Ordering::Relaxed)
    }

    /// The groups switched quiet on their own, sorted.
    pub(crate) fn groups(&self) -> Vec<String> {
        self.groups.lock().iter().cloned().collect()
    }

    /// Which switch keeps `group` quiet, if one does.
    pub(crate) fn by(&self, group: &str) -> QuietBy {
        if self.node() {
            QuietBy::Node
        } else if self.groups.lock().contains(group) {
            QuietBy::Group
        } else {
            QuietBy::Off
        }
    }

    /// Whether the bot is quiet in `group`.
    pub(crate) fn in_group(&self, group: &str) -> bool {
        self.by(group) != QuietBy::Off
    }
}

/// How many `/why` a person may ask in a group: [`WHY_BURST`] at once, then one every
/// 60 / [`WHY_PER_MINUTE`] seconds. A flood of `/why` would otherwise be a flood of
/// bot messages (50 of them held a real answer back 150 s on Telegram).
pub(crate) const WHY_PER_MINUTE: f64 = 2.0;
/// The `/why` a person may ask at once in a group.
pub(crate) const WHY_BURST: f64 = 3.0;
/// The (group, person) buckets kept before full ones are dropped.
const WHY_KEYS: usize = 4096;

/// Each person's `/why` allowance in each group ([`WHY_PER_MINUTE`]).
#[derive(Default)]
pub(crate) struct WhyLimits {
    /// A token bucket per (group, person).
    buckets: Mutex<HashMap<(String, String), crate::config::pacing::TokenBucket>>,
}

impl WhyLimits {
    /// Takes one `/why` of `person` in `group` at `now`; `Err` (how long until the
    /// next) when they asked too many.
    pub(crate) fn take(
        &self,
        group: &str,
        person: &str,
        now: tokio::time::Instant,
    ) -> Result<(), std::time::Duration> {
        let mut buckets = self.buckets.lock();
        if buckets.len() >= WHY_KEYS {
            buckets.retain(|_, b| !b.is_full(now));
        }
        buckets
            .entry((group.to_string(), person.to_string()))
            .or_insert_with(|| {
                crate::config::pacing::TokenBucket::full(WHY_PER_MINUTE / 60.0, WHY_BURST, now)
            })
            .take(now)
    }
}

/// A turn's stop signal: cancelled by its group's `/stop`, and saying who said it, so
/// what the turn leaves behind ("stopped by Boss": its status, its outcome line) names
/// the person who stopped this very turn.
#[derive(Clone, Default)]
pub(crate) struct StopSignal {
    /// Cancelled by the group's `/stop`: the turns holding it drop.
    token: CancellationToken,
    /// Who said the `/stop`, set before `token` is cancelled.
    by: Arc<std::sync::OnceLock<String>>,
}

impl StopSignal {
    /// Resolves once the turn is stopped.
    pub(crate) async fn cancelled(&self) {
        self.token.cancelled().await
    }

    /// Whether the turn is stopped.
    #[cfg(test)]
    pub(crate) fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Who stopped the turn; `None` while it is not stopped.
    pub(crate) fn by(&self) -> Option<String> {
        self.by.get().cloned()
    }

    /// Stops the turns holding this signal, `by` saying so.
    fn stop(&self, by: &str) {
        let _ = self.by.set(by.to_string());
        self.token.cancel();
    }
}

/// Each group's stop signal: every turn takes its group's signal when it starts, and
/// `/stop` cancels it (the turns in flight drop) and leaves a fresh one for the next.
#[derive(Default)]
pub(crate) struct GroupStops {
    /// group → the signal the group's current turns hold.
    tokens: Mutex<HashMap<String, StopSignal>>,
}

impl GroupStops {
    /// The signal a turn starting now in `group` holds.
    pub(crate) fn token(&self, group: &str) -> StopSignal {
        self.tokens
            .lock()
            .entry(group.to_string())
            .or_default()
            .clone()
    }

    /// Groups with a signal (for `botmesh_cache_entries`).
    pub(crate) fn len(&self) -> usize {
        self.tokens.lock().len()
    }

    /// Stops every turn in flight in `group` (`by` said so); turns started afterwards
    /// go on.
    pub(crate) fn stop(&self, group: &str, by: &str) {
        if let Some(t) = self.tokens.lock().remove(group) {
            t.stop(by);
        }
    }
}

/// One step of what this bot decided about a message: a recorded decision, or a note
/// (the claim's relevance and delay).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Step {
    /// `reply`, `judge`, `silent`, `claim`, `yield`, …
    pub action: &'static str,
    /// The stable reason code.
    pub reason: &'static str,
    /// The detail the decision log carries (may be empty).
    pub detail: String,
}

/// How many messages the trail remembers decisions about.
const TRAIL_MESSAGES: usize = 512;

/// How many steps it keeps for one message.
const TRAIL_STEPS: usize = 16;

/// The decisions about the most recent messages, as the decision log records them
/// (`record::record`): what `/why` reads back. Bounded in messages and steps.
#[derive(Default)]
pub(crate) struct Trail {
    /// The steps, and the order to forget them in.
    inner: Mutex<Steps>,
}

/// message → its steps, and the messages in the order first decided on.
type Steps = (IdMap<Vec<Step>>, VecDeque<Ulid>);

/// The model's tool loop (`engine::model`) notes its tool calls in the trail.
impl crate::engine::model::ToolTrail for Trail {
    fn note_tool(&self, trigger: Ulid, action: &'static str, reason: &'static str, detail: &str) {
        self.note(trigger, action, reason, detail);
    }
}

impl Trail {
    /// Adds a step about `msg`.
    pub(crate) fn note(&self, msg: Ulid, action: &'static str, reason: &'static str, detail: &str) {
        let mut guard = self.inner.lock();
        let (map, order) = &mut *guard;
        let steps = map.entry(msg).or_insert_with(|| {
            order.push_back(msg);
            Vec::new()
        });
        if steps.len() < TRAIL_STEPS {
            steps.push(Step {
                action,
                reason,
                detail: detail.into(),
            });
        }
        while order.len() > TRAIL_MESSAGES {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    /// Messages with steps on record (for `botmesh_cache_entries`).
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().0.len()
    }

    /// The steps about `msg`, oldest first (empty: nothing recorded).
    pub(crate) fn steps(&self, msg: Ulid) -> Vec<Step> {
        self.inner.lock().0.get(&msg).cloned().unwrap_or_default()
    }
}

/// The message a `/why` command (`cmd`, in `recent`) asks about: the last message
/// before it that is not a command, not an answer to one, and not `me`'s own.
pub(crate) fn why_subject(
    recent: &[Arc<Envelope>],
    cmd: &Envelope,
    t: &Tuning,
) -> Option<Arc<Envelope>> {
    let me = &t.me.name;
    let end = recent
        .iter()
        .position(|e| e.id == cmd.id)
        .unwrap_or(recent.len());
    let before = without_commands(recent[..end].to_vec(), t);
    before
        .into_iter()
        .rev()
        .find(|e| !(e.author.kind == AuthorKind::Bot && &e.author.name == me))
}

/// At most `max` characters of `text` on one line, with `…` when cut, and without its
/// `@`s: a quote in a `/why` answer must not mention (or, on a platform, ping) anyone.
fn snippet(text: &str, max: usize) -> String {
    let one_line: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(['@', '＠'], "");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut s: String = one_line.chars().take(max).collect();
    s.push('…');
    s
}

/// What `/why` posts: in a few lines, why `me` did or did not speak on `subject`
/// (`None`: no message to ask about) — whom it mentions, the decisions recorded
/// about it (action, reason, relevance and delay of a claim), what `me` answered if
/// it did, and the quiet switch that keeps the group quiet, if one does.
pub(crate) fn why_text(
    me: &str,
    matcher: &MentionMatcher,
    subject: Option<&Envelope>,
    steps: &[Step],
    answer: Option<&Envelope>,
    quiet: QuietBy,
) -> String {
    let Some(msg) = subject else {
        return format!("{me}: no earlier message here to explain.");
    };
    let mut lines = vec![format!(
        "{me}, on {}'s message \"{}\":",
        msg.author.name,
        snippet(&msg.text, 60)
    )];
    let mentions = matcher.mentioned(&msg.text, &[]);
    let mentioned = mentions.iter().any(|n| n == me);
    lines.push(if mentions.is_empty() {
        "- mentioned: no (it mentions no bot)".to_string()
    } else {
        format!(
            "- mentioned: {} (it mentions {})",
            if mentioned { "yes" } else { "no" },
            mentions.join(", ")
        )
    });
    if steps.is_empty() {
        lines.push(
            "- decided: nothing recorded (it came before this node started, while it was stopping, or long ago)"
                .to_string(),
        );
    } else {
        let trail: Vec<String> = steps
            .iter()
            .map(|s| {
                if s.detail.is_empty() {
                    format!("{} ({})", s.action, s.reason)
                } else {
                    format!("{} ({}: {})", s.action, s.reason, s.detail)
                }
            })
            .collect();
        lines.push(format!("- decided: {}", trail.join(" → ")));
    }
    lines.push(match answer {
        Some(a) => format!("- spoke: \"{}\"", snippet(&a.text, 60)),
        None => "- spoke: no".to_string(),
    });
    match quiet {
        QuietBy::Off => {}
        QuietBy::Group => lines.push("- now: quiet here (/resume lifts it)".to_string()),
        QuietBy::Node => lines.push(
            "- now: quiet everywhere (the operator's switch: botmesh quiet --off lifts it)"
                .to_string(),
        ),
    }
    lines.join("\n")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{BotSettings, MeshSettings};
    use crate::turn::mention::Member;
    use crate::turn::tuning::Provider;
    use crate::wire::envelope::Author;

    /// Alice's tuning, with colleagues Bob (local) and Dee (DingTalk), and `operators`.
    pub(crate) fn tuning(operators: Option<&[&str]>) -> Tuning {
        let bot = |toml: &str| BotSettings::from_toml(toml).expect("bot");
        Tuning {
            me: Arc::new(bot("name = \"Alice\"")),
            colleagues: vec![
                bot("name = \"Bob\""),
                bot("name = \"Dee\"\nplatform = \"dingtalk\""),
            ],
            provider: Provider::Offline,
            mesh: Arc::new(MeshSettings {
                operators: operators.map(|o| o.iter().map(|s| s.to_string()).collect()),
                ..MeshSettings::default()
            }),
            budget: Default::default(),
        }
    }

    fn matcher() -> MentionMatcher {
        let m = |name: &str, aliases: &[&str]| Member {
            name: name.into(),
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
            open_ids: vec![format!("ou_{name}")],
        };
        MentionMatcher::new(&[m("Alice", &["小爱"]), m("Bob", &[])])
    }

    fn human(text: &str) -> Envelope {
        Envelope::message(
            Ulid::new(),
            1,
            "demo",
            "Alice",
            Author::human("carol"),
            text,
        )
    }

    fn parsed(text: &str) -> Option<Command> {
        parse(&human(text), &matcher(), &[])
    }

    fn to(verb: Verb, bots: &[&str]) -> Option<Command> {
        Some(Command {
            verb,
            target: if bots.is_empty() {
                Target::All
            } else {
                Target::Bots(bots.iter().map(|b| b.to_string()).collect())
            },
        })
    }

    #[test]
    fn verbs_any_case_mentions_before_or_after() {
        assert_eq!(parsed("/quiet"), to(Verb::Quiet, &[]));
        assert_eq!(parsed("  /RESUME please"), to(Verb::Resume, &[]));
        assert_eq!(parsed("/Stop"), to(Verb::Stop, &[]));
        assert_eq!(parsed("/ALLOW"), to(Verb::Allow, &[]));
        assert_eq!(parsed("@Alice /deny"), to(Verb::Deny, &["Alice"]));
        assert_eq!(parsed("/allowance"), None);
        assert_eq!(parsed("/why @Alice"), to(Verb::Why, &["Alice"]));
        assert_eq!(parsed("@Alice /why"), to(Verb::Why, &["Alice"]));
        assert_eq!(parsed("@bob /quiet"), to(Verb::Quiet, &["Bob"]));
        assert_eq!(
            parsed("@Alice @Bob /stop!"),
            to(Verb::Stop, &["Alice", "Bob"])
        );
        assert_eq!(parsed("@Alice/why"), to(Verb::Why, &["Alice"]));
    }

    #[test]
    fn cjk_names_full_width_forms_and_platform_tags() {
        assert_eq!(parsed("@小爱 /why"), to(Verb::Why, &["Alice"]));
        assert_eq!(parsed("＠小爱／why"), to(Verb::Why, &["Alice"]));
        assert_eq!(parsed("/quiet @小爱"), to(Verb::Quiet, &["Alice"]));
        assert_eq!(parsed("/why＠小爱"), to(Verb::Why, &["Alice"]));
        // A person outside the mesh, as Feishu and Discord show them, then a bot.
        assert_eq!(
            parsed("<at user_id=\"ou_x\">Dan</at> @Bob /stop"),
            to(Verb::Stop, &["Bob"])
        );
        // Feishu's placeholder, resolved through the event's mention list.
        let platform = [PlatformMention {
            key: "@_user_1".into(),
            open_id: "ou_Bob".into(),
            name: "Bob".into(),
        }];
        assert_eq!(
            parse(&human("@_user_1 /why"), &matcher(), &platform),
            to(Verb::Why, &["Bob"])
        );
    }

    #[test]
    fn ordinary_text_is_no_command() {
        for text in [
            "/whyever",
            "/foo @Alice",
            "please /stop",
            "why /stop",
            "`/stop`",
            "/usr/bin/env",
            "/",
            "@Alice",
            "",
            "停止 /停",
        ] {
            assert_eq!(parsed(text), None, "{text:?}");
        }
        // Only people command: a bot's `/quiet` is ordinary text.
        let mut bot = human("/quiet");
        bot.author = Author::bot("Bob");
        assert_eq!(parse(&bot, &matcher(), &[]), None);
        assert!(!is_command(&bot, &tuning(None)));
        // Someone outside the mesh is no target: the command is for every bot.
        assert_eq!(parsed("/quiet ops@alice.dev"), to(Verb::Quiet, &[]));
    }

    #[test]
    fn commands_and_their_answers_stay_out_of_the_context() {
        let q = Arc::new(human("what about caching?"));
        let cmd = Arc::new(human("/why @Alice"));
        let mut answer = Envelope::message(
            Ulid::new(),
            2,
            "demo",
            "Alice",
            Author::bot("Alice"),
            "Alice, on …",
        );
        answer.reply_to = Some(cmd.id);
        let answer = Arc::new(answer);
        let mut bot_slash = human("/quiet");
        bot_slash.author = Author::bot("Bob");
        let bot_slash = Arc::new(bot_slash);
        let all = vec![q.clone(), cmd.clone(), answer.clone(), bot_slash.clone()];
        let t = tuning(None);
        let kept: Vec<Ulid> = without_commands(all.clone(), &t)
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(kept, vec![q.id, bot_slash.id]);
        let later = without_commands_after(&all[..2], vec![answer.clone(), bot_slash.clone()], &t);
        assert_eq!(later.len(), 1, "the answer to an earlier command goes too");
        // `/why` asks about the last message before it that is not a command.
        let cmd2 = Arc::new(human("/why"));
        let mut all = all;
        all.push(cmd2.clone());
        assert_eq!(why_subject(&all, &cmd2, &t).unwrap().id, bot_slash.id);
        assert_eq!(why_subject(&all, &cmd, &t).unwrap().id, q.id);
        assert!(why_subject(&all[..1], &q, &t).is_none());
    }

    #[test]
    fn stop_cancels_the_turns_in_flight_only() {
        let stops = GroupStops::default();
        let before = stops.token("demo");
        let other = stops.token("ops");
        stops.stop("demo", "Boss");
        assert_eq!(before.by().as_deref(), Some("Boss"), "the turn knows who");
        assert!(before.is_cancelled());
        assert_eq!(other.by(), None);
        assert!(!other.is_cancelled(), "another group goes on");
        assert!(!stops.token("demo").is_cancelled(), "later turns go on");
        stops.stop("empty", "Boss");
    }

    #[test]
    fn the_trail_is_bounded_and_why_reads_it_back() {
        let trail = Trail::default();
        let first = Ulid::new();
        for i in 0..(TRAIL_STEPS + 4) {
            trail.note(first, "judge", "needs_judge", &i.to_string());
        }
        assert_eq!(trail.steps(first).len(), TRAIL_STEPS);
        for _ in 0..TRAIL_MESSAGES {
            trail.note(Ulid::new(), "silent", "not_mentioned", "");
        }
        assert!(trail.steps(first).is_empty(), "the oldest message went");
        assert_eq!(trail.len(), TRAIL_MESSAGES);

        let msg = human("any ideas on caching?");
        let steps = vec![
            Step {
                action: "judge",
                reason: "judge",
                detail: String::new(),
            },
            Step {
                action: "silent",
                reason: "judge_declined",
                detail: "speak=false relevance=0.20".into(),
            },
        ];
        let quoted = why_text(
            "Bob",
            &matcher(),
            Some(&human("@Alice ＠Bob go")),
            &[],
            None,
            QuietBy::Off,
        );
        assert!(quoted.contains("\"Alice Bob go\""), "{quoted}");
        assert!(matcher().mentioned(&quoted, &[]).is_empty(), "{quoted}");
        let text = why_text(
            "Alice",
            &matcher(),
            Some(&msg),
            &steps,
            None,
            QuietBy::Group,
        );
        assert_eq!(
            text,
            "Alice, on carol's message \"any ideas on caching?\":\n\
             - mentioned: no (it mentions no bot)\n\
             - decided: judge (judge) → silent (judge_declined: speak=false relevance=0.20)\n\
             - spoke: no\n\
             - now: quiet here (/resume lifts it)"
        );
        let text = why_text("Alice", &matcher(), Some(&msg), &[], None, QuietBy::Node);
        assert!(
            text.ends_with(
                "- now: quiet everywhere (the operator's switch: botmesh quiet --off lifts it)"
            ),
            "{text}"
        );
    }

    #[test]
    fn only_operators_steer_and_everyone_asks_why() {
        let carried_by = |sender: &str, name: &str, person: Option<&str>, text: &str| {
            let mut env = human(text);
            env.sender = sender.into();
            env.author = Author::human(name);
            env.person = person.map(str::to_string);
            env
        };
        let ops = tuning(Some(&["local:Boss", "dingtalk:staff7"]));
        // On the page or the API of a local node: the name they post under.
        let boss = carried_by("Alice", "Boss", None, "/quiet");
        assert_eq!(person_of(&boss, &ops), vec!["local:Boss".to_string()]);
        assert!(is_command(&boss, &ops));
        assert!(
            is_command(&carried_by("Bob", "Boss", None, "/stop"), &ops),
            "a local colleague carries local people"
        );
        for not_boss in ["boss", "Boss\u{200b}", "Carol"] {
            let env = carried_by("Alice", not_boss, None, "／QUIET");
            assert!(!is_command(&env, &ops), "{not_boss:?}");
            assert!(!may_command(Verb::Quiet, &env, &ops));
        }
        assert!(!is_command(
            &carried_by("Alice", "Carol", None, "@Alice /quiet"),
            &ops
        ));
        // `/why` is everyone's.
        assert!(is_command(
            &carried_by("Alice", "Carol", None, "/why"),
            &ops
        ));
        // A DingTalk colleague is believed about DingTalk's people only.
        assert!(is_command(
            &carried_by("Dee", "Mgr", Some("staff7 $:x"), "/resume"),
            &ops
        ));
        assert!(!is_command(
            &carried_by("Dee", "Mgr", Some("staff8"), "/resume"),
            &ops
        ));
        assert!(!is_command(
            &carried_by("Dee", "Mgr", None, "/resume"),
            &ops
        ));
        // A local colleague claiming a DingTalk id: read as its own platform's person.
        let forged = carried_by("Bob", "Mgr", Some("staff7"), "/quiet");
        assert_eq!(person_of(&forged, &ops), vec!["local:Mgr".to_string()]);
        assert!(!is_command(&forged, &ops));
        // An unknown sender carries nobody.
        assert!(person_of(&carried_by("Zed", "Boss", None, "/quiet"), &ops).is_empty());
        // Without `[mesh] operators` everyone commands.
        assert!(is_command(
            &carried_by("Alice", "Carol", None, "/quiet"),
            &tuning(None)
        ));
        // A non-operator's command stays in the LLM's context: it is ordinary text.
        let text = Arc::new(carried_by("Alice", "Carol", None, "/stop the presses"));
        assert_eq!(without_commands(vec![text.clone()], &ops).len(), 1);
        assert!(without_commands(vec![text], &tuning(None)).is_empty());
    }

    #[test]
    fn the_quiet_switches() {
        let q = Quiet::new(false);
        assert!(!q.set_group("a", true));
        assert!(q.set_group("a", true), "already on");
        assert_eq!(q.by("a"), QuietBy::Group);
        assert_eq!(q.by("b"), QuietBy::Off, "another group still answers");
        assert!(!q.set_node(true));
        assert_eq!(q.by("b"), QuietBy::Node);
        assert_eq!(q.by("a"), QuietBy::Node, "the node-wide switch rules");
        assert!(q.set_group("a", false));
        assert!(
            q.in_group("a"),
            "a group's /resume does not lift the node-wide switch"
        );
        q.set_node(false);
        assert!(!q.in_group("a"));
        assert_eq!(q.groups(), Vec::<String>::new());
    }
}
