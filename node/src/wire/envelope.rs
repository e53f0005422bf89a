//! The envelope: one message on the bridge, exactly as it travels between nodes.
//!
//! The JSON shape is the wire protocol of DESIGN.md. Unknown fields are ignored on
//! input so that nodes of different versions can share a mesh.

use serde::{Deserialize, Serialize};
use ulid::Ulid;

use crate::wire::limits::{MAX_DEPTH, MAX_NAME_BYTES};

/// The protocol version this node writes into every envelope it creates.
pub const PROTOCOL_VERSION: u32 = 1;

/// The largest text a node accepts in one envelope, in bytes. Bodies are capped at
/// 256 KiB on the wire; text is the only field that can be large.
pub(crate) const MAX_TEXT_BYTES: usize = 200 * 1024;

/// The most bot entries one verdict may carry (far more than any mesh has bots).
pub(crate) const MAX_VERDICT_ENTRIES: usize = 256;

/// Prefix of a direct chat's group name (`direct:<platform chat id>`): one person
/// and this one bot. Everything a person writes there is addressed to the bot, and
/// nothing said there goes to the peers (they are not in it).
pub const DIRECT_GROUP_PREFIX: &str = "direct:";

/// Whether `group` is a direct chat ([`DIRECT_GROUP_PREFIX`]).
pub fn is_direct_group(group: &str) -> bool {
    group.starts_with(DIRECT_GROUP_PREFIX)
}

/// What an envelope carries: a chat message, or a claim to answer a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A message that is shown in the group chat.
    Message,
    /// "I intend to answer `reply_to` with this relevance": lets bots yield to each
    /// other before anyone speaks. Never shown as a chat message.
    Claim,
    /// The shared judge's answer about `reply_to` for every bot it was asked for
    /// (`[mesh] judge = "shared"`): advice each bot applies with its own thresholds.
    /// Empty `verdicts`: the judge call failed, every bot judges itself. Never shown.
    Verdict,
    /// A bot's status message while a long turn runs ("Coder is working (1m 10s): ran
    /// `cargo test`"), posted once to the chat and edited there in place. Recorded and
    /// shown as status, never conversation: it triggers no colleague, is not put in a
    /// prompt or judged, and does not answer its `reply_to` (the answer comes as a
    /// message). A node older than this kind refuses it as malformed (400), which its
    /// sender takes as final; it then sees the platform's copy only, which nobody
    /// answers (a colleague's copy without a bridge copy is context).
    Status,
}

/// One bot's entry in a shared [`Kind::Verdict`]: what the judge said about it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BotVerdict {
    /// Whether the bot should interject.
    pub speak: bool,
    /// How relevant the message is to the bot, 0..1 (ranks the bots that speak).
    pub relevance: f64,
}

/// Whether an author is a person or a bot of the mesh; humans reset the depth counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "snake_case")]
pub enum AuthorKind {
    /// Anyone who is not a bot in peers.toml.
    Human,
    /// A member of the mesh.
    Bot,
}

/// Who wrote a message (which may differ from the node that signed and sent it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Author {
    /// Display name: a bot's canonical name, or the human's name.
    pub name: String,
    /// Human or bot.
    pub kind: AuthorKind,
}

impl Author {
    /// The bot `name`, cut to [`MAX_NAME_BYTES`] (see [`Author::cut`]): a configured
    /// bot's name always fits; a platform's name for a bot outside the mesh may not.
    pub(crate) fn bot(name: impl Into<String>) -> Author {
        Author::cut(name.into(), AuthorKind::Bot)
    }

    /// The person `name`, cut to [`MAX_NAME_BYTES`] (see [`Author::cut`]): the chat
    /// platforms' display names are not bounded, and a peer refuses a longer one.
    pub(crate) fn human(name: impl Into<String>) -> Author {
        Author::cut(name.into(), AuthorKind::Human)
    }

    /// An author whose name is cut to [`MAX_NAME_BYTES`] (logged when it is): names a
    /// node takes from a chat platform come this way, so what it sends its peers
    /// passes their check.
    fn cut(mut name: String, kind: AuthorKind) -> Author {
        let keep = cut_name(&name).len();
        if keep < name.len() {
            tracing::info!(
                bytes = name.len(),
                kept = keep,
                "author name cut to {MAX_NAME_BYTES} bytes"
            );
            name.truncate(keep);
        }
        Author { name, kind }
    }
}

/// `name` cut to at most [`MAX_NAME_BYTES`] bytes, at a character boundary: what
/// [`Author::human`] keeps of a platform's name, and what a prompt shows of any name
/// (a transcript written before names were bounded may hold longer ones).
pub(crate) fn cut_name(name: &str) -> &str {
    let mut keep = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    &name[..keep]
}

/// The depth of a message that answers one at `depth`: one deeper, but never past
/// [`MAX_DEPTH`] (saturating, so an answer can never wrap to depth 0 and restart the
/// loop brake's count). Every place a depth grows uses it.
pub(crate) fn next_depth(depth: u32) -> u32 {
    depth.saturating_add(1).min(MAX_DEPTH)
}

/// Why a bot spoke, attached to its own messages so people can follow turn-taking.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Why {
    /// The message answered an @mention of this bot.
    Mentioned,
    /// The bot interjected after its judge rated the trigger at `relevance`.
    Interjected {
        /// The judge's relevance, 0..1.
        relevance: f64,
    },
    /// The bot answers every human message (participation = "always").
    AlwaysAnswers,
    /// Posted by an external program through the local API (sidecar or operator).
    Posted,
}

/// One message on the bridge. See DESIGN.md "Wire protocol".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Protocol version; lets future nodes branch on old senders.
    #[serde(default = "default_version")]
    pub v: u32,
    /// Unique id, never reused; the unit of deduplication and replay protection.
    pub id: Ulid,
    /// Message or claim.
    pub kind: Kind,
    /// The chat this belongs to (Feishu chat_id or a local room name).
    pub group: String,
    /// The node that signed and sent the envelope; its key must verify the signature.
    pub sender: String,
    /// Who wrote it: the sending bot itself or a human whose message that node carries.
    pub author: Author,
    /// The message text (empty for claims).
    #[serde(default)]
    pub text: String,
    /// Bot turns since the last human message: the loop brake.
    pub depth: u32,
    /// The message this one answers (for claims: the trigger being claimed).
    #[serde(default)]
    pub reply_to: Option<Ulid>,
    /// The human message that started this exchange.
    #[serde(default)]
    pub root: Option<Ulid>,
    /// The platform's own message id (Feishu `om_…`, a Discord snowflake), so a message
    /// seen on the platform and on the bridge is processed once. A message the platform
    /// took in several parts carries each part's id, separated by spaces.
    #[serde(default)]
    pub platform_msg_id: Option<String>,
    /// For a person's message from a chat platform: the platform's id of the person
    /// (Feishu open_id, Discord user id, DingTalk staff id), which a display name is
    /// not. Read with the sender's platform, so `[mesh] operators` can tell who may
    /// steer the bots; a node older than this field ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub person: Option<String>,
    /// Sender's clock when the envelope was created, unix milliseconds.
    pub sent_at: u64,
    /// For claims: how relevant the claiming bot judged the trigger, 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relevance: Option<f64>,
    /// For a bot's own messages: why it spoke.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<Why>,
    /// For a verdict: each bot's entry, by bot name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdicts: Option<std::collections::BTreeMap<String, BotVerdict>>,
    /// On a bot's line saying how one of its agent's turns ended ("stopped by Alice",
    /// `turn::outcome`): what the bot's agent is told of that end at its next turn
    /// ("Your last turn was stopped by Alice."). Kept in the transcript, so the agent
    /// is told even after a restart; its presence marks the message as a turn's end.
    /// Old nodes ignore it (unknown fields are), and see the line as a bot message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_end: Option<String>,
    /// On a status: the status message whose text this one replaces — its final
    /// version ("Coder: done in 2m 13s"), recorded when the turn ends so the
    /// transcript keeps how the turn went (the page and `GET /v1/transcript` show the
    /// status with this text, and a reloaded page too). It may carry the agent's
    /// [`Envelope::turn_end`] (a turn whose status said how it ended has no line). A
    /// node older than this field ignores it and shows a second status: never
    /// conversation either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<Ulid>,
}

fn default_version() -> u32 {
    PROTOCOL_VERSION
}

/// Why an envelope body was refused before any signature check.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// Not valid JSON or not the envelope shape.
    #[error("malformed envelope: {0}")]
    Malformed(String),
    /// Well-formed JSON whose values break a protocol rule.
    #[error("invalid envelope: {0}")]
    Invalid(std::borrow::Cow<'static, str>),
}

impl EnvelopeError {
    fn invalid(why: impl Into<std::borrow::Cow<'static, str>>) -> EnvelopeError {
        EnvelopeError::Invalid(why.into())
    }
}

impl Envelope {
    /// A new chat message that answers nothing (depth 0): a person's message, or a
    /// bot's own message that starts an exchange. The one way to build an envelope;
    /// [`Envelope::answer`] and [`Envelope::claim`] start from it.
    pub(crate) fn message(
        id: Ulid,
        sent_at: u64,
        group: impl Into<String>,
        sender: impl Into<String>,
        author: Author,
        text: impl Into<String>,
    ) -> Envelope {
        Envelope {
            v: PROTOCOL_VERSION,
            id,
            kind: Kind::Message,
            group: group.into(),
            sender: sender.into(),
            author,
            text: text.into(),
            depth: 0,
            reply_to: None,
            root: None,
            platform_msg_id: None,
            person: None,
            sent_at,
            relevance: None,
            why: None,
            verdicts: None,
            turn_end: None,
            replaces: None,
        }
    }

    /// Bot `me`'s answer to `trigger`: one turn deeper, in the same exchange.
    pub(crate) fn answer(
        id: Ulid,
        sent_at: u64,
        me: &str,
        trigger: &Envelope,
        text: String,
        why: Why,
    ) -> Envelope {
        let mut env = Envelope::message(
            id,
            sent_at,
            trigger.group.clone(),
            me,
            Author::bot(me),
            text,
        );
        env.depth = next_depth(trigger.depth);
        env.reply_to = Some(trigger.id);
        env.root = trigger.root.or(Some(trigger.id));
        env.why = Some(why);
        env
    }

    /// Bot `me`'s claim on `trigger` at `relevance` (`0.0`: its withdrawal).
    pub(crate) fn claim(
        id: Ulid,
        sent_at: u64,
        me: &str,
        trigger: &Envelope,
        relevance: f64,
    ) -> Envelope {
        let mut env =
            Envelope::message(id, sent_at, trigger.group.clone(), me, Author::bot(me), "");
        env.kind = Kind::Claim;
        env.depth = trigger.depth;
        env.reply_to = Some(trigger.id);
        env.root = trigger.root.or(Some(trigger.id));
        env.relevance = Some(relevance);
        env
    }

    /// The shared judge `me`'s verdict on `trigger`: each bot's entry (none: the judge
    /// call failed, each bot judges itself).
    pub(crate) fn verdict(
        id: Ulid,
        sent_at: u64,
        me: &str,
        trigger: &Envelope,
        verdicts: std::collections::BTreeMap<String, BotVerdict>,
    ) -> Envelope {
        let mut env = Envelope::claim(id, sent_at, me, trigger, 0.0);
        env.kind = Kind::Verdict;
        env.relevance = None;
        env.verdicts = Some(verdicts);
        env
    }

    /// Parses and checks a raw body. Invalid UTF-8 is reported as malformed.
    ///
    /// The whole body is checked as UTF-8 first: `serde_json::from_slice` skips the
    /// strings of unknown fields without validating them, so a body with invalid bytes
    /// in a field this version ignores would otherwise be accepted (found by the
    /// `envelope_parse` fuzz target; JSON must be UTF-8, RFC 8259 §8.1).
    pub(crate) fn parse(body: &[u8]) -> Result<Envelope, EnvelopeError> {
        let text = std::str::from_utf8(body)
            .map_err(|e| EnvelopeError::Malformed(format!("body is not UTF-8: {e}")))?;
        let env: Envelope =
            serde_json::from_str(text).map_err(|e| EnvelopeError::Malformed(e.to_string()))?;
        env.check()?;
        Ok(env)
    }

    /// Protocol rules that serde's types cannot express.
    pub(crate) fn check(&self) -> Result<(), EnvelopeError> {
        if self.group.is_empty() || self.group.len() > 256 {
            return Err(EnvelopeError::invalid("group must be 1..=256 bytes"));
        }
        if self.sender.is_empty() || self.author.name.is_empty() {
            return Err(EnvelopeError::invalid(
                "sender and author.name must not be empty",
            ));
        }
        if self.author.name.len() > MAX_NAME_BYTES {
            return Err(EnvelopeError::invalid(format!(
                "author.name is {} bytes, over {MAX_NAME_BYTES}",
                self.author.name.len()
            )));
        }
        if self.depth > MAX_DEPTH {
            return Err(EnvelopeError::invalid(format!(
                "depth {} is over {MAX_DEPTH}",
                self.depth
            )));
        }
        if self.text.len() > MAX_TEXT_BYTES {
            return Err(EnvelopeError::invalid("text too long"));
        }
        match self.kind {
            Kind::Message if self.text.trim().is_empty() => {
                return Err(EnvelopeError::invalid("a message needs text"))
            }
            Kind::Status if self.text.trim().is_empty() => {
                return Err(EnvelopeError::invalid("a status needs text"))
            }
            Kind::Status if self.author.kind != AuthorKind::Bot => {
                return Err(EnvelopeError::invalid("a status is a bot's"))
            }
            _ if self.replaces.is_some() && self.kind != Kind::Status => {
                return Err(EnvelopeError::invalid("only a status replaces a status"))
            }
            Kind::Claim if self.reply_to.is_none() => {
                return Err(EnvelopeError::invalid("a claim needs reply_to"))
            }
            Kind::Claim
                if !self
                    .relevance
                    .is_some_and(|r| r.is_finite() && (0.0..=1.0).contains(&r)) =>
            {
                return Err(EnvelopeError::invalid("a claim needs relevance in 0..1"))
            }
            Kind::Verdict if self.reply_to.is_none() => {
                return Err(EnvelopeError::invalid("a verdict needs reply_to"))
            }
            Kind::Verdict
                if !self.verdicts.as_ref().is_some_and(|v| {
                    v.len() <= MAX_VERDICT_ENTRIES
                        && v.values()
                            .all(|b| b.relevance.is_finite() && (0.0..=1.0).contains(&b.relevance))
                }) =>
            {
                return Err(EnvelopeError::invalid(
                    "a verdict needs verdicts (at most 256), each relevance in 0..1",
                ))
            }
            _ => {}
        }
        if self.author.kind == AuthorKind::Human && self.depth != 0 {
            return Err(EnvelopeError::invalid("a human message has depth 0"));
        }
        if let Some(person) = &self.person {
            if self.author.kind != AuthorKind::Human || person.is_empty() || person.len() > 256 {
                return Err(EnvelopeError::invalid(
                    "person is a human author's platform id, 1..=256 bytes",
                ));
            }
        }
        Ok(())
    }

    /// Serializes for the wire; the exact bytes are what gets signed.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope always serializes")
    }

    /// True for messages written by a human.
    pub(crate) fn is_human(&self) -> bool {
        self.author.kind == AuthorKind::Human
    }
}

/// The envelope id of a message read from a chat platform: the same on every node
/// that reads (or forwards) it, so that the bots' claims, acknowledgements and answers
/// name the same trigger. Time part: when the platform says it was sent; random part:
/// 80 bits of SHA-256 of the platform's name and its message id.
pub fn platform_message_id(platform: &str, message_id: &str, sent_at_ms: u64) -> Ulid {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{platform}:{message_id}").as_bytes(),
    );
    let mut random = [0u8; 16];
    random[6..].copy_from_slice(&digest.as_ref()[..10]);
    Ulid::from_parts(sent_at_ms, u128::from_be_bytes(random))
}

/// Current wall-clock time in unix milliseconds.
pub fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        Envelope {
            v: 1,
            id: Ulid::new(),
            kind: Kind::Message,
            group: "demo".into(),
            sender: "XiaoBa".into(),
            author: Author {
                name: "XiaoBa".into(),
                kind: AuthorKind::Bot,
            },
            text: "@ErGoz 你看下这个 PR".into(),
            depth: 1,
            reply_to: None,
            root: None,
            platform_msg_id: None,
            person: None,
            sent_at: 1,
            relevance: None,
            why: None,
            verdicts: None,
            turn_end: None,
            replaces: None,
        }
    }

    #[test]
    fn a_persons_platform_id_travels_on_a_persons_message_only() {
        let mut env = sample();
        env.person = Some("5005".into());
        assert!(env.check().is_err(), "a bot's message names no person");
        env.author = Author::human("Carol");
        env.depth = 0;
        env.check().expect("a person's message may");
        let back = Envelope::parse(&env.to_bytes()).expect("parses");
        assert_eq!(back.person.as_deref(), Some("5005"));
        env.person = Some(String::new());
        assert!(env.check().is_err());
        // Absent, it is not written at all (the bytes older nodes sign and read).
        env.person = None;
        assert!(!String::from_utf8(env.to_bytes())
            .unwrap()
            .contains("person"));
    }

    #[test]
    fn round_trips_and_ignores_unknown_fields() {
        let e = sample();
        let mut v: serde_json::Value = serde_json::from_slice(&e.to_bytes()).unwrap();
        v["future_field"] = serde_json::json!({"x": 1});
        let back = Envelope::parse(v.to_string().as_bytes()).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn rejects_rule_breakers() {
        let mut e = sample();
        e.author.kind = AuthorKind::Human;
        assert!(e.check().is_err(), "human with depth 1");
        let mut e = sample();
        e.kind = Kind::Claim;
        e.reply_to = Some(Ulid::new());
        e.relevance = Some(1.5);
        assert!(e.check().is_err());
        e.relevance = Some(0.5);
        assert!(e.check().is_ok());
        assert!(Envelope::parse(b"{not json").is_err());
        assert!(Envelope::parse(&[0xff, 0xfe, 0x00]).is_err());
        assert!(Envelope::parse(br#"{"id":"nope"}"#).is_err());
    }

    #[test]
    fn depths_past_the_bound_are_refused_with_the_reason() {
        for depth in [MAX_DEPTH + 1, u32::MAX] {
            let mut e = sample();
            e.depth = depth;
            let err = Envelope::parse(&e.to_bytes()).unwrap_err();
            assert!(
                matches!(&err, EnvelopeError::Invalid(m) if m.contains(&format!("depth {depth} is over {MAX_DEPTH}"))),
                "{err}"
            );
        }
        let mut e = sample();
        e.depth = MAX_DEPTH;
        assert!(e.check().is_ok(), "the bound itself is allowed");
    }

    #[test]
    fn an_answer_to_the_deepest_message_does_not_wrap() {
        assert_eq!(next_depth(0), 1);
        assert_eq!(next_depth(MAX_DEPTH - 1), MAX_DEPTH);
        assert_eq!(next_depth(MAX_DEPTH), MAX_DEPTH);
        assert_eq!(next_depth(u32::MAX), MAX_DEPTH, "saturates, never 0");
        let mut trigger = sample();
        trigger.depth = MAX_DEPTH;
        let answer = Envelope::answer(
            Ulid::new(),
            2,
            "ErGoz",
            &trigger,
            "ok".into(),
            Why::Mentioned,
        );
        assert_eq!(answer.depth, MAX_DEPTH);
        assert!(answer.check().is_ok(), "a peer accepts the answer");
    }

    #[test]
    fn long_author_names_are_refused_and_platform_names_cut() {
        let mut e = sample();
        e.author.kind = AuthorKind::Human;
        e.depth = 0;
        e.author.name = "n".repeat(200 * 1024);
        let err = Envelope::parse(&e.to_bytes()).unwrap_err();
        assert!(
            err.to_string()
                .contains("author.name is 204800 bytes, over 64"),
            "{err}"
        );
        e.author.name = "n".repeat(MAX_NAME_BYTES);
        assert!(e.check().is_ok(), "64 bytes is allowed");
        // 22 three-byte characters are 66 bytes: cut at a character boundary.
        let cut = Author::human("名".repeat(22));
        assert_eq!(cut.name, "名".repeat(21));
        assert_eq!(Author::bot("x".repeat(1000)).name.len(), MAX_NAME_BYTES);
        assert_eq!(Author::human("dana").name, "dana");
    }

    #[test]
    fn verdicts_round_trip_and_are_checked() {
        let trigger = sample();
        let mut v = std::collections::BTreeMap::new();
        v.insert(
            "ErGoz".to_string(),
            BotVerdict {
                speak: true,
                relevance: 0.8,
            },
        );
        let e = Envelope::verdict(Ulid::new(), 2, "XiaoBa", &trigger, v.clone());
        assert_eq!(e.kind, Kind::Verdict);
        assert_eq!(Envelope::parse(&e.to_bytes()).unwrap(), e);
        let mut bad = e.clone();
        bad.verdicts
            .as_mut()
            .unwrap()
            .get_mut("ErGoz")
            .unwrap()
            .relevance = 2.0;
        assert!(bad.check().is_err(), "relevance out of range");
        let mut bad = e.clone();
        bad.verdicts = None;
        assert!(bad.check().is_err(), "no verdicts");
        let mut bad = e;
        bad.reply_to = None;
        assert!(bad.check().is_err(), "no trigger");
    }

    #[test]
    fn relevance_round_trips_exactly() {
        // Regression (fuzz/regressions/envelope_parse/float-round-trip): without
        // serde_json's `float_roundtrip` feature, "0.4442444444444445" parsed to a
        // neighbouring f64, so a claim's relevance could differ by one ulp between the
        // node that sent it and the nodes comparing it.
        for text in [
            "0.4442444444444445",
            "0.44424444444444444",
            "0.1",
            "0.7000000000000001",
        ] {
            let want: f64 = text.parse().unwrap();
            let got: f64 = serde_json::from_str(text).unwrap();
            assert_eq!(got.to_bits(), want.to_bits(), "{text}");
        }
        let mut e = sample();
        e.why = Some(Why::Interjected {
            relevance: "0.4442444444444445".parse().unwrap(),
        });
        assert_eq!(Envelope::parse(&e.to_bytes()).unwrap(), e);
    }

    #[test]
    fn rejects_invalid_utf8_even_in_unknown_fields() {
        // Regression (fuzz/regressions/envelope_parse): serde_json skips the strings
        // of ignored fields without validating them.
        let mut body = sample().to_bytes();
        body.pop();
        body.extend_from_slice(b",\"future\":\"\xff\xfe\"}");
        assert!(matches!(
            Envelope::parse(&body),
            Err(EnvelopeError::Malformed(m)) if m.contains("UTF-8")
        ));
    }
}
