//! The served bot's Agent Card (`GET /.well-known/agent-card.json`), A2A 1.0: how a
//! caller learns the bot's name, what it does, where to send tasks and how to
//! authenticate. Public, as the protocol wants: it holds no secret.

use serde_json::{json, Value};

use crate::a2a::rpc::PROTOCOL_VERSION;
use crate::config::BotSettings;

/// Where the card is served.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// Where the JSON-RPC endpoint is served.
pub const RPC_PATH: &str = "/a2a";

/// The card of `bot` served at `base` (`http://host:port`, as the caller reached the
/// API): a JSON-RPC interface at `<base>/a2a`, streaming, its skills from the bot's, and
/// a bearer scheme when callers need tokens (`bearer`).
pub fn agent_card(bot: &BotSettings, base: &str, bearer: bool) -> Value {
    let description = if bot.role.trim().is_empty() {
        format!("{}, a bot in a botmesh group chat", bot.name)
    } else {
        format!("{}: {}", bot.name, bot.role)
    };
    let skills: Vec<Value> = bot
        .skills
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({
                "id": format!("skill-{}", i + 1),
                "name": s,
                "description": format!("{} ({})", s, bot.name),
                "tags": [s],
            })
        })
        .collect();
    let skills = if skills.is_empty() {
        vec![json!({
            "id": "chat",
            "name": "chat",
            "description": format!("Ask {} anything its group chat can answer", bot.name),
            "tags": ["chat"],
        })]
    } else {
        skills
    };
    let mut card = json!({
        "name": bot.name,
        "description": description,
        "supportedInterfaces": [{
            "url": format!("{}{RPC_PATH}", base.trim_end_matches('/')),
            "protocolBinding": "JSONRPC",
            "protocolVersion": PROTOCOL_VERSION,
        }],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": false},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
        "provider": {"organization": "botmesh", "url": "https://github.com/botmesh"},
    });
    if bearer {
        card["securitySchemes"] =
            json!({"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}});
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
    }
    card
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_card_names_the_endpoint_the_version_and_the_scheme() {
        let bot = BotSettings::from_toml("role = \"reviewer\"\nskills = [\"Rust\", \"代码审查\"]")
            .unwrap();
        let card = agent_card(&bot, "http://127.0.0.1:8101/", true);
        assert_eq!(card["name"], "A");
        assert_eq!(card["description"], "A: reviewer");
        let i = &card["supportedInterfaces"][0];
        assert_eq!(i["url"], "http://127.0.0.1:8101/a2a");
        assert_eq!(i["protocolBinding"], "JSONRPC");
        assert_eq!(i["protocolVersion"], "1.0");
        assert_eq!(card["capabilities"]["streaming"], true);
        assert_eq!(card["skills"][1]["name"], "代码审查");
        assert_eq!(
            card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
            "Bearer"
        );
        let open = agent_card(&bot, "http://127.0.0.1:8101", false);
        assert!(open.get("securitySchemes").is_none());
    }
}
