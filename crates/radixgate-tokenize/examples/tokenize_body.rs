//! Print the prompt token ids of a request body, as the router computes them.
//!
//! ```sh
//! cargo run -p radixgate-tokenize --example tokenize_body -- \
//!     MODEL_DIR_OR_TOKENIZER_JSON /v1/chat/completions [vllm|sglang] < body.json
//! ```
//!
//! `/generate` bodies with `input_ids` need no tokenizer: pass `-` as the
//! path.

use std::io::Read;

use radixgate_tokenize::{Endpoint, Engine, Tokenizer, body_token_ids};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: tokenize_body PATH|- ENDPOINT_PATH [vllm|sglang] < body.json";
    let path = args.next().ok_or(usage)?;
    let endpoint = args.next().ok_or(usage)?;
    let endpoint = Endpoint::from_path(&endpoint).ok_or("unknown endpoint path")?;
    let engine = match args.next().as_deref() {
        None | Some("vllm") => Engine::Vllm,
        Some("sglang") => Engine::Sglang,
        Some(other) => return Err(format!("unknown engine {other:?}").into()),
    };
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text)?;
    let body: serde_json::Value = serde_json::from_str(&text)?;
    let ids = if path == "-" {
        body_token_ids(endpoint, &body)?.ok_or("this body carries text: give a tokenizer")?
    } else {
        let tok = Tokenizer::load(&path)?.with_engine(engine);
        if endpoint == Endpoint::ChatCompletions {
            eprintln!("{:?}", tok.render_chat(&body)?);
        }
        tok.prompt_tokens(endpoint, &body)?
    };
    println!("{} tokens: {ids:?}", ids.len());
    Ok(())
}
