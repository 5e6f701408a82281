//! Integration tests: a real tokenizer trained in process and written to a
//! temporary model directory, loaded the way the router and the simulated
//! worker load one.

mod chat;
mod endpoints;
mod load;

use radixgate_tokenize::Tokenizer;
use radixgate_tokenize::testing::{TempDir, TestModel};

/// The default test model directory and its tokenizer.
fn model() -> (TempDir, Tokenizer) {
    let dir = TestModel::default().write_temp().expect("test model");
    let tok = Tokenizer::load(dir.path()).expect("loads");
    (dir, tok)
}

/// A model directory whose template is `template`.
fn model_with_template(template: &str) -> (TempDir, Tokenizer) {
    let dir = TestModel {
        chat_template: Some(template.to_owned()),
        ..TestModel::default()
    }
    .write_temp()
    .expect("test model");
    let tok = Tokenizer::load(dir.path()).expect("loads");
    (dir, tok)
}

/// The id of a special token of the test tokenizer.
fn special(tok: &Tokenizer, token: &str) -> u32 {
    let ids = tok.encode(token, false).unwrap();
    assert_eq!(ids.len(), 1, "{token} is one token");
    ids[0]
}
