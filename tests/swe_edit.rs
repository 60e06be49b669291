//! SEARCH/REPLACE blocks derived from two texts always reproduce the new text.

use proptest::prelude::*;
use sorft::swe::edit::{apply_blocks, blocks_from_texts, parse_blocks, render_blocks};
use std::collections::BTreeMap;

fn text() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(
            prop_oneof![Just("a"), Just("b"), Just("c"), Just("    x = 1"), Just("")],
            1..25,
        ),
        any::<bool>(),
    )
        .prop_map(|(v, nl)| {
            let mut s = v.join("\n");
            if nl {
                s.push('\n');
            }
            s
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn blocks_reproduce_new_text(old in text(), new in text(), context in 0usize..3) {
        prop_assume!(old != new && !old.trim().is_empty());
        let blocks = blocks_from_texts("f.py", &old, &new, context);
        let files = BTreeMap::from([("f.py".to_string(), old.clone())]);
        let out = apply_blocks(&files, &blocks).unwrap();
        prop_assert_eq!(&out["f.py"], &new);
        // Rendering and re-parsing keeps the blocks when every line ends in a newline.
        if old.ends_with('\n') && new.ends_with('\n') {
            prop_assert_eq!(parse_blocks(&render_blocks(&blocks)), blocks);
        }
    }
}
