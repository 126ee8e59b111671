//! bench-out/results.jsonl: one JSON object per measured figure, `{"bench": SECTION, ...}`,
//! written as it is measured, so a run that fails half-way keeps what it measured.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{Map, Value};

/// The results file of one run.
#[derive(Debug)]
pub struct Results {
    path: PathBuf,
    file: RefCell<File>,
}

impl Results {
    /// Creates (truncates) the file.
    pub fn create(path: &Path) -> anyhow::Result<Results> {
        let file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Results {
            path: path.to_owned(),
            file: RefCell::new(file),
        })
    }

    /// Appends one line: `fields` (a JSON object) tagged with the section's name.
    pub fn emit(&self, bench: &str, fields: Value) -> anyhow::Result<()> {
        let line = tagged(bench, fields);
        let mut file = self.file.borrow_mut();
        writeln!(file, "{line}")
            .and_then(|()| file.flush())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `{"bench": bench, ...fields}`; a value that is not an object goes under `"value"`.
fn tagged(bench: &str, fields: Value) -> Value {
    let mut out = Map::new();
    out.insert("bench".into(), Value::from(bench));
    match fields {
        Value::Object(map) => {
            for (k, v) in map {
                if k != "bench" {
                    out.insert(k, v);
                }
            }
        }
        other => {
            out.insert("value".into(), other);
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_line_is_an_object_tagged_with_its_section() {
        let dir = std::env::temp_dir().join(format!("xtask-results-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("results.jsonl");
        let results = Results::create(&path).expect("create");
        results
            .emit(
                "peers",
                json!({"peer": "limitador", "rep": 1, "bench": "ignored"}),
            )
            .expect("emit");
        results.emit("redis", json!(3)).expect("emit");
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(
            lines,
            vec![
                json!({"bench": "peers", "peer": "limitador", "rep": 1}),
                json!({"bench": "redis", "value": 3}),
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
