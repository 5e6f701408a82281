//! The two texts of a simulated request: what the router matches, and what
//! the worker tokenizes.
//!
//! They differ on purpose, exactly as they do in a real run. For a chat
//! request the gateway renders each message by the routing text rule of
//! `radixgate_routing::text` (`<|role|>\n{content}<|end|>\n`) — its own
//! routing text, never sent on — while the simulated worker renders the
//! same messages with its ChatML template ([`render_chat`]) and tokenizes
//! that. Text APIs (`completions`, `/generate`) use the prompt text for
//! both. The routing text is built by that same rule here, so the simulator
//! matches exactly what the gateway would. The reply is the worker's
//! deterministic reply ([`reply_text`]) seeded by the worker's prompt text,
//! so a multi-turn conversation continues with the same words it would get
//! from `radixgate worker`. [`prompt_and_final`] tokenizes the worker's
//! text with and without the reply, as the engine needs them.

use radixgate_routing::RoutingText;

use crate::load::Api;
use crate::tokens::{ChatMessage, Tokenizer, render_chat, reply_text, text_hash};
use crate::workload::{Message, Prompt, Role};

/// The messages a chat body carries for `prompt` (a text prompt becomes one
/// user message, as the load tool sends it).
fn chat_messages(prompt: &Prompt) -> Vec<(Role, &str)> {
    match prompt {
        Prompt::Chat(msgs) => msgs
            .iter()
            .map(|m: &Message| (m.role, m.content.as_str()))
            .collect(),
        Prompt::Text(t) => vec![(Role::User, t.as_str())],
    }
}

/// The text the gateway would match in its prefix tree for `prompt` sent
/// through `api`.
pub fn routing_text(prompt: &Prompt, api: Api) -> String {
    let mut text = RoutingText::new();
    match api {
        Api::ChatCompletions => {
            for (role, content) in chat_messages(prompt) {
                text.push_plain_message(role.as_str(), content);
            }
        }
        Api::Completions | Api::Generate | Api::Embeddings => {
            text.push_prompt_str(&prompt.to_text());
        }
    }
    text.into_string()
}

/// The text the simulated worker would tokenize for `prompt` sent through
/// `api`.
pub fn worker_text(prompt: &Prompt, api: Api) -> String {
    match api {
        Api::ChatCompletions => {
            let msgs: Vec<ChatMessage> = chat_messages(prompt)
                .into_iter()
                .map(|(role, content)| ChatMessage {
                    role: role.as_str().to_owned(),
                    content: content.to_owned(),
                })
                .collect();
            render_chat(&msgs)
        }
        Api::Completions | Api::Generate | Api::Embeddings => prompt.to_text(),
    }
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
