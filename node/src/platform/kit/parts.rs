//! The one way a message cut into parts is posted ([`post_in_parts`]): part by part,
//! in order; the first part decides whether the post happened at all, a later part
//! that fails ends it with what is already on the platform, and the posted parts' ids
//! joined by a space are the message's platform id (`store::transcript::platform_ids`
//! reads them back; an edit changes the first).

use std::fmt::Display;
use std::future::Future;

use ulid::Ulid;

/// Whose message a post is and where it goes, for its log lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PostTo<'a> {
    /// The platform, as in peers.toml.
    pub(crate) platform: &'static str,
    /// The bot posting.
    pub(crate) bot: &'a str,
    /// The envelope posted.
    pub(crate) id: &'a Ulid,
    /// The chat it goes to (a channel, chat or room id), as the platform names it.
    pub(crate) chat: &'a str,
}

/// Posts `parts` in order, `post(i, part)` each, and returns the posted parts' ids
/// joined by a space (logged). A first part that fails fails the post: nothing is on
/// the platform (the mesh still gets the message). A later part that fails ends the
/// post with the parts already posted. `empty` is the error when there is no part.
pub(crate) async fn post_in_parts<T, E, Fut>(
    to: PostTo<'_>,
    parts: &[T],
    empty: impl FnOnce() -> E,
    mut post: impl FnMut(usize, &T) -> Fut,
) -> Result<String, E>
where
    E: Display,
    Fut: Future<Output = Result<String, E>>,
{
    let mut ids = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        match post(i, part).await {
            Ok(id) => ids.push(id),
            Err(e) if ids.is_empty() => {
                tracing::error!(bot = %to.bot, id = %to.id, chat = %to.chat, error = %e, "could not post to {}; the mesh still gets the message", to.platform);
                return Err(e);
            }
            Err(e) => {
                tracing::error!(bot = %to.bot, id = %to.id, chat = %to.chat, part = i + 1, parts = parts.len(), error = %e, "could not post a later part to {}", to.platform);
                break;
            }
        }
    }
    if ids.is_empty() {
        return Err(empty());
    }
    let joined = ids.join(" ");
    tracing::info!(bot = %to.bot, id = %to.id, chat = %to.chat, platform_msg_id = %joined, "posted to {}", to.platform);
    Ok(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(id: &Ulid) -> PostTo<'_> {
        PostTo {
            platform: "test",
            bot: "Ada",
            id,
            chat: "c1",
        }
    }

    async fn post(parts: &[&str], failing: Option<usize>) -> (Result<String, String>, usize) {
        let id = Ulid::new();
        let mut tried = 0;
        let got = post_in_parts(
            to(&id),
            parts,
            || "empty".to_string(),
            |i, part| {
                tried += 1;
                let got = match failing {
                    Some(f) if f == i => Err(format!("part {i} refused")),
                    _ => Ok(format!("m-{part}")),
                };
                async move { got }
            },
        )
        .await;
        (got, tried)
    }

    #[tokio::test]
    async fn parts_are_posted_in_order_and_their_ids_joined() {
        let (got, tried) = post(&["a", "b", "c"], None).await;
        assert_eq!((got.unwrap().as_str(), tried), ("m-a m-b m-c", 3));
    }

    #[tokio::test]
    async fn a_failed_first_part_fails_the_post_and_a_later_one_ends_it() {
        let (got, tried) = post(&["a", "b"], Some(0)).await;
        assert_eq!((got.unwrap_err().as_str(), tried), ("part 0 refused", 1));
        let (got, tried) = post(&["a", "b", "c"], Some(1)).await;
        assert_eq!(
            (got.unwrap().as_str(), tried),
            ("m-a", 2),
            "what is posted stays"
        );
        let (got, tried) = post(&[], None).await;
        assert_eq!((got.unwrap_err().as_str(), tried), ("empty", 0));
    }
}
