//! Write the test tokenizer (a small byte-level BPE trained in process, see
//! `radixgate_tokenize::testing`) as a model directory whose chat template
//! renders as the simulated worker does, so that `radixgate serve
//! --tokenizer DIR` and `radixgate worker --tokenizer DIR` compute the same
//! prompt ids, as a real router and engine sharing a model directory do
//! (`bench/kv_events.py`).
//!
//! ```sh
//! cargo run --release -p radixgate-tokenize --example write_test_model -- DIR
//! ```

use radixgate_tokenize::testing::{CHATML_TEMPLATE, TestModel};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: write_test_model DIR")?;
    let model = TestModel {
        chat_template: Some(CHATML_TEMPLATE.to_owned()),
        ..TestModel::default()
    };
    model.write(std::path::Path::new(&dir))?;
    println!("{dir}");
    Ok(())
}
