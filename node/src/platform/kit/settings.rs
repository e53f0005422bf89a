//! What every adapter's settings need once: a bot's table read, with the keys a bot on
//! the platform must give named when it has none ([`read_table`]), and this node's
//! secret read from the variable a key names ([`secret`]).

use serde::de::DeserializeOwned;

use crate::config::platform::{TableCheck, TableProblem};
use crate::config::{NodeConfig, Platform};

/// Bot `cx.bot`'s table read as `T`; none at all is a problem naming the keys it needs
/// (`needs`): the registry checks a missing table only for a bot on this platform.
pub(crate) fn read_table<T: DeserializeOwned + Default>(
    cx: &TableCheck<'_>,
    needs: &str,
) -> Result<T, TableProblem> {
    if cx.table.is_none() {
        let p = cx.platform;
        return Err(cx.problem("", format!("a {p} bot needs a [bots.{p}] table ({needs})")));
    }
    cx.read()
}

/// This node's secret from the variable its `[bots.<platform>]` key `key` names (read
/// at start: `NodeConfig::platform_secret`), trimmed; an empty one is an error naming
/// the key, `fix` saying what to set it to.
pub(crate) fn secret(
    cfg: &NodeConfig,
    platform: Platform,
    key: &str,
    fix: &str,
) -> anyhow::Result<String> {
    let value = cfg
        .platform_secret(key)
        .unwrap_or_default()
        .trim()
        .to_string();
    if value.is_empty() {
        anyhow::bail!(
            "bots[{}].{platform}.{key}: the variable it names is empty; {fix}",
            cfg.me
        );
    }
    Ok(value)
}
