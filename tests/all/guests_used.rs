//! Every guest the tests build is used. `tests/build.rs` builds the Rust guests of its
//! `GUESTS` list (example plugins and the purpose-built guests of `tests/guests/`); the
//! JavaScript and Python plugins are built by the tests that use them. A guest no test or
//! scenario runs costs build time and reads as coverage that is not there, and a Rust guest
//! folder missing from `GUESTS` is tested by nothing.
//!
//! A guest counts as used when a test's code (comments do not count) names its component
//! (`env!("STATEBOX_GUEST_<NAME>")`, or a constant bound to it that is then used) or its
//! folder (`plugins/<name>`, `tests/guests/<name>`), or a scenario file runs it (its
//! `processor` or a restart step's).

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The workspace root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests package lives in the workspace")
}

/// The folders guests live in, relative to the workspace root.
const GUEST_PARENTS: &[&str] = &["plugins", "tests/guests"];

/// One guest folder.
#[derive(Debug)]
struct Guest {
    /// `plugins/<name>` or `tests/guests/<name>`.
    folder: String,
    /// The folder's (and, for Rust guests, the package's) name.
    name: String,
    /// A Rust guest (a `Cargo.toml`), which `build.rs` must build.
    rust: bool,
    /// In `build.rs`'s `GUESTS`.
    built: bool,
}

/// A source file of the tests, as (path for messages, text).
type Source = (String, String);

/// What is wrong: guests built or present but used by nothing, Rust guests not built.
fn problems(guests: &[Guest], sources: &[Source], scenarios: &[Value]) -> Vec<String> {
    let code: Vec<(String, String)> = sources
        .iter()
        .map(|(path, text)| (path.clone(), strip_comments(text)))
        .collect();
    let run_by_scenarios: Vec<&str> = scenarios
        .iter()
        .flat_map(|s| {
            let top = s.get("processor").and_then(Value::as_str);
            let steps = s
                .get("steps")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|step| step.get("processor").and_then(Value::as_str));
            top.into_iter().chain(steps)
        })
        .collect();
    let mut problems = Vec::new();
    for g in guests {
        if g.rust && !g.built {
            problems.push(format!(
                "{} is a Rust guest that tests/build.rs does not build: add `{}` to GUESTS \
                 and use it in a test or scenario, or remove it",
                g.folder, g.name
            ));
            continue;
        }
        let by_scenario = run_by_scenarios
            .iter()
            .any(|p| p.trim_end_matches('/') == g.folder);
        let by_code = names_folder(&code, &g.folder) || (g.built && names_component(&code, g));
        if !by_scenario && !by_code {
            problems.push(format!(
                "{} is {} but no test or scenario uses it: use it, or remove it{}",
                g.folder,
                if g.built {
                    "built by tests/build.rs"
                } else {
                    "a guest"
                },
                if g.built { " and its GUESTS entry" } else { "" }
            ));
        }
    }
    problems
}

/// The text without `//` comments (line and doc comments; a `//` inside a string, as in a
/// URL, ends the line's code early, which only ever hides a use, never invents one).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.split_once("//").map_or(line, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether some code names `folder` as a path: followed by a quote or a `/`.
fn names_folder(code: &[(String, String)], folder: &str) -> bool {
    code.iter().any(|(_, text)| {
        text.match_indices(folder).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + folder.len()..].chars().next();
            matches!(before, Some('"' | '/')) && matches!(after, Some('"' | '/'))
        })
    })
}

/// Whether some code uses the component `build.rs` made of `g`: `env!("STATEBOX_GUEST_X")`
/// used in place, or bound to a constant (`const C: &str = env!(..)`) whose name is then
/// used — anywhere in the tests if the constant is in the shared library (`tests/src`), in
/// its own file otherwise.
fn names_component(code: &[(String, String)], g: &Guest) -> bool {
    let var = format!(
        "env!(\"STATEBOX_GUEST_{}\")",
        g.name.replace('-', "_").to_uppercase()
    );
    code.iter().any(|(path, text)| {
        text.lines().filter(|l| l.contains(&var)).any(|line| {
            let Some(constant) = bound_constant(line) else {
                return true;
            };
            let shared = path.starts_with("tests/src/");
            code.iter()
                .filter(|(p, _)| if shared { p != path } else { p == path })
                .any(|(_, other)| {
                    other
                        .lines()
                        .filter(|l| !l.contains(&var))
                        .any(|l| has_word(l, constant))
                })
        })
    })
}

/// `C` of a line `[pub] const C: &str = env!(..);`.
fn bound_constant(line: &str) -> Option<&str> {
    let rest = line.trim_start();
    let rest = rest.strip_prefix("pub ").unwrap_or(rest);
    let rest = rest.strip_prefix("const ")?;
    let (name, _) = rest.split_once(':')?;
    Some(name.trim())
}

/// Whether `line` holds `word` with no identifier character on either side.
fn has_word(line: &str, word: &str) -> bool {
    let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    line.match_indices(word).any(|(at, _)| {
        !ident(line[..at].chars().next_back()) && !ident(line[at + word.len()..].chars().next())
    })
}

/// Every guest folder, marked with whether `build.rs` builds it.
fn guest_folders(built: &[&str]) -> Vec<Guest> {
    let mut guests = Vec::new();
    for parent in GUEST_PARENTS {
        let dir = root().join(parent);
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|entry| entry.expect("read a directory entry").path())
            .filter(|p| p.is_dir())
            .collect();
        entries.sort();
        for path in entries {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a UTF-8 folder name")
                .to_owned();
            let rust = path.join("Cargo.toml").is_file();
            let guest =
                rust || path.join("package.json").is_file() || path.join("processor.py").is_file();
            if guest {
                guests.push(Guest {
                    folder: format!("{parent}/{name}"),
                    built: built.contains(&name.as_str()),
                    name,
                    rust,
                });
            }
        }
    }
    guests
}

/// The files of `dir` ending in `.ext`, as (path relative to the workspace root, text).
fn files(dir: &str, ext: &str) -> Vec<(String, String)> {
    let full = root().join(dir);
    let mut out: Vec<(String, String)> = std::fs::read_dir(&full)
        .unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
        .map(|entry| entry.expect("read a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a UTF-8 name");
            (format!("{dir}/{name}"), text)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_guest_the_tests_build_is_used() {
    let built: Vec<&str> = env!("STATEBOX_GUESTS").split(',').collect();
    let guests = guest_folders(&built);
    // Every GUESTS entry is a guest folder (build.rs would not build it otherwise, but a
    // renamed folder must not leave this test checking nothing).
    for name in &built {
        assert!(
            guests.iter().any(|g| g.built && g.name == *name),
            "GUESTS entry `{name}` is no folder under {GUEST_PARENTS:?}"
        );
    }
    assert!(
        guests.len() > built.len(),
        "the JS and Python plugins are guests too: {guests:?}"
    );
    // This file names no guest; leaving it out keeps its own text from counting.
    let sources: Vec<Source> = files("tests/all", "rs")
        .into_iter()
        .chain(files("tests/src", "rs"))
        .filter(|(path, _)| path != "tests/all/guests_used.rs")
        .collect();
    let scenarios: Vec<Value> = files("tests/scenarios", "json")
        .into_iter()
        .map(|(path, text)| {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
        })
        .collect();
    let problems = problems(&guests, &sources, &scenarios);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check itself finds what it claims to: a guest named only in a comment, one bound
/// to a constant nobody uses, and a Rust guest folder that is not built.
#[test]
fn the_guest_check_finds_unused_and_unbuilt_guests() {
    let guest = |folder: &str, rust: bool, built: bool| Guest {
        folder: folder.to_owned(),
        name: folder.rsplit('/').next().expect("a name").to_owned(),
        rust,
        built,
    };
    let guests = [
        guest("plugins/used-inline", true, true),
        guest("tests/guests/used-by-const", true, true),
        guest("plugins/used-by-scenario", true, true),
        guest("plugins/used-by-path-py", false, false),
        guest("plugins/comment-only", true, true),
        guest("tests/guests/const-unused", true, true),
        guest("plugins/not-built", true, false),
        guest("plugins/unused-js", false, false),
    ];
    let sources: Vec<Source> = vec![
        (
            "tests/src/lib.rs".into(),
            "pub const USED_BY_CONST: &str = env!(\"STATEBOX_GUEST_USED_BY_CONST\");\n\
             pub const CONST_UNUSED: &str = env!(\"STATEBOX_GUEST_CONST_UNUSED\");\n"
                .into(),
        ),
        (
            "tests/all/a.rs".into(),
            "let w = env!(\"STATEBOX_GUEST_USED_INLINE\");\n\
             run(guests::USED_BY_CONST);\n\
             let p = root().join(\"plugins/used-by-path-py/processor.py\");\n\
             // env!(\"STATEBOX_GUEST_COMMENT_ONLY\") and \"plugins/unused-js\"\n\
             /// `plugins/comment-only`\n\
             run(guests::CONST_UNUSED_NOT);\n"
                .into(),
        ),
        (
            "tests/all/b.rs".into(),
            "let s = \"plugins/not-built\";\n".into(),
        ),
    ];
    let scenarios = [serde_json::json!({
        "processor": "tests/guests/timer-ops",
        "steps": [{"restart": true, "processor": "plugins/used-by-scenario"}],
    })];
    let found = problems(&guests, &sources, &scenarios);
    let flagged: Vec<&str> = guests
        .iter()
        .filter(|g| {
            found
                .iter()
                .any(|p| p.starts_with(&format!("{} ", g.folder)))
        })
        .map(|g| g.folder.as_str())
        .collect();
    assert_eq!(
        flagged,
        [
            "plugins/comment-only",
            "tests/guests/const-unused",
            "plugins/not-built",
            "plugins/unused-js",
        ],
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p
                .contains("plugins/not-built is a Rust guest that tests/build.rs does not build")),
        "{found:#?}"
    );
}
