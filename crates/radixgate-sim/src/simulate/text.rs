//! The two texts of a simulated request: what the router matches, and what
//! the worker tokenizes.
//!
//! They differ on purpose, exactly as they do in a real run. For a chat
//! request the gateway renders each message by the routing text rule of
//! `radixgate_routing::text` (`<|role|>\n{content}<|end|>\n`) — its own
//! routing text, never sent on — while the simulated worker renders the
//! same messages with its ChatML template ([`render_chat`]) and tokenizes
//! that; the Responses and Messages APIs carry the same messages and are
//! read the same way. Text APIs (`completions`, `/generate`) use the
//! prompt text for both. The routing text is built by that same rule here, so the simulator
//! matches exactly what the gateway would. The reply is the worker's
//! deterministic reply ([`reply_text`]) seeded by the worker's prompt text,
//! so a multi-turn conversation continues with the same words it would get
//! from `radixgate worker`. [`prompt_and_final`] tokenizes the worker's
//! text with and without the reply, as the engine needs them.

use std::borrow::Cow;

use radixgate_routing::RoutingText;

use crate::load::Api;
use crate::load::body::{conversation, split_system};
use crate::tokens::{ChatMessage, Tokenizer, render_chat, reply_text, text_hash};
use crate::workload::{Prompt, Role};

/// The messages `prompt` is sent as through a conversation API, as
/// (role, content) in order. The Messages API sends the leading system
/// messages as `system` blocks, which both the gateway and the worker read
/// as one system message of their texts joined.
fn conversation_for(prompt: &Prompt, api: Api) -> Vec<(&'static str, Cow<'_, str>)> {
    fn borrow<'a>(&(role, content): &(Role, &'a str)) -> (&'static str, Cow<'a, str>) {
        (role.as_str(), Cow::Borrowed(content))
    }
    let messages = conversation(prompt);
    if api != Api::Messages {
        return messages.iter().map(borrow).collect();
    }
    let (system, rest) = split_system(&messages);
    let mut out = Vec::with_capacity(rest.len() + 1);
    if !system.is_empty() {
        out.push((Role::System.as_str(), Cow::Owned(system.concat())));
    }
    out.extend(rest.iter().map(borrow));
    out
}

/// The text the gateway would match in its prefix tree for `prompt` sent
/// through `api`.
pub fn routing_text(prompt: &Prompt, api: Api) -> String {
    let mut text = RoutingText::new();
    if api.is_conversation() {
        for (role, content) in conversation_for(prompt, api) {
            text.push_plain_message(role, &content);
        }
    } else {
        text.push_prompt_str(&prompt.to_text());
    }
    text.into_string()
}

/// The text the simulated worker would tokenize for `prompt` sent through
/// `api`.
pub fn worker_text(prompt: &Prompt, api: Api) -> String {
    if !api.is_conversation() {
        return prompt.to_text();
    }
    let msgs: Vec<ChatMessage> = conversation_for(prompt, api)
        .into_iter()
        .map(|(role, content)| ChatMessage {
            role: role.to_owned(),
            content: content.into_owned(),
        })
        .collect();
    render_chat(&msgs)
}

/// The reply the simulated worker gives to `worker_text`.
pub fn worker_reply(worker_text: &str, max_tokens: usize, tokenizer: &Tokenizer) -> String {
    reply_text(text_hash(worker_text), max_tokens, tokenizer)
}

/// The prompt's tokens and the tokens of prompt + reply, tokenizing once.
/// Tokens are runs of `chars_per_token` characters from the start, so the
/// two agree on every complete run of the prompt; only a trailing partial
/// run of the prompt is a token of its own.
pub(super) fn prompt_and_final(t: &Tokenizer, text: &str, reply: &str) -> (Vec<u64>, Vec<u64>) {
    let all = t.tokenize(&format!("{text}{reply}"));
    let chars = text.chars().count();
    let cpt = t.chars_per_token();
    let full = chars / cpt;
    let mut prompt = all[..full].to_vec();
    if !chars.is_multiple_of(cpt) {
        let tail_start = text
            .char_indices()
            .nth(full * cpt)
            .map_or(text.len(), |(b, _)| b);
        prompt.extend(t.tokenize(&text[tail_start..]));
    }
    (prompt, all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Message;

    #[test]
    fn chat_texts_keep_roles_and_extend_across_turns() {
        let t1 = Prompt::Chat(vec![
            Message::new(Role::System, "sys"),
            Message::new(Role::User, "hi"),
        ]);
        let r = routing_text(&t1, Api::ChatCompletions);
        assert_eq!(r, "<|system|>\nsys<|end|>\n<|user|>\nhi<|end|>\n");
        let w = worker_text(&t1, Api::ChatCompletions);
        assert!(w.starts_with("<|im_start|>system\nsys<|im_end|>\n"));
        let Prompt::Chat(mut msgs) = t1 else {
            unreachable!()
        };
        msgs.push(Message::new(Role::Assistant, "reply"));
        msgs.push(Message::new(Role::User, "more"));
        let t2 = Prompt::Chat(msgs);
        assert!(routing_text(&t2, Api::ChatCompletions).starts_with(&r));
        assert!(worker_text(&t2, Api::ChatCompletions).starts_with(&format!("{w}reply")));
        let text = Prompt::Text("abc".into());
        assert_eq!(routing_text(&text, Api::Completions), "abc");
        assert_eq!(worker_text(&text, Api::Generate), "abc");
        assert_eq!(
            routing_text(&text, Api::ChatCompletions),
            "<|user|>\nabc<|end|>\n"
        );
        // The Responses API carries the same messages; the Messages API
        // joins the leading system messages into one.
        assert_eq!(
            routing_text(&t2, Api::Responses),
            routing_text(&t2, Api::ChatCompletions)
        );
        let two_systems = Prompt::Chat(vec![
            Message::new(Role::System, "a"),
            Message::new(Role::System, "b"),
            Message::new(Role::User, "hi"),
        ]);
        assert_eq!(
            routing_text(&two_systems, Api::Messages),
            "<|system|>\nab<|end|>\n<|user|>\nhi<|end|>\n"
        );
        assert!(
            worker_text(&two_systems, Api::Messages)
                .starts_with("<|im_start|>system\nab<|im_end|>\n")
        );
    }

    #[test]
    fn prompt_and_final_match_separate_tokenization() {
        let t = Tokenizer::new(4).unwrap();
        for text in ["", "abc", "abcd", "abcdé", "héllo wörld!"] {
            let (p, f) = prompt_and_final(&t, text, "reply text");
            assert_eq!(p, t.tokenize(text), "{text:?}");
            assert_eq!(f, t.tokenize(&format!("{text}reply text")));
        }
    }
}
