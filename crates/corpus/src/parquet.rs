//! Parquet export of a corpus's records (`corpus.parquet`, `splits/NAME.parquet`), for users
//! who load corpora with pandas, polars, DuckDB or Spark rather than JSON Lines.
//!
//! One row per validated episode, flat columns (nested parts of the manifest — run summaries,
//! validation — as JSON text), uncompressed, one row group. The JSON Lines export stays the
//! reference: both are written from the same records in the same order.

use std::path::Path;
use std::sync::Arc;

use parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use crate::error::CorpusError;
use crate::record::Record;

/// How a column reads its value from a record; `None` is a null.
enum Get {
    Text(fn(&Record) -> Option<String>),
    Int(fn(&Record) -> Option<i64>),
    Bool(fn(&Record) -> Option<bool>),
}

/// One column: its name, whether it may hold nulls, and its value.
struct Column {
    name: &'static str,
    optional: bool,
    get: Get,
}

const fn required(name: &'static str, get: Get) -> Column {
    Column {
        name,
        optional: false,
        get,
    }
}

const fn optional(name: &'static str, get: Get) -> Column {
    Column {
        name,
        optional: true,
        get,
    }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("a manifest part serialises")
}

/// The columns, in file order: the schema and the writer both read this one list.
const COLUMNS: &[Column] = &[
    required("split", Get::Text(|r| Some(r.split.clone()))),
    required("trace_id", Get::Text(|r| Some(r.trace_id.clone()))),
    required("episode", Get::Text(|r| Some(r.manifest.id.clone()))),
    required("agent", Get::Text(|r| Some(r.manifest.agent.clone()))),
    required("task", Get::Text(|r| Some(r.manifest.task.clone()))),
    required(
        "deficiency",
        Get::Text(|r| Some(r.manifest.deficiency.clone())),
    ),
    required("variant", Get::Text(|r| Some(r.manifest.variant.clone()))),
    required("strategy", Get::Text(|r| Some(r.manifest.strategy.clone()))),
    required("template", Get::Text(|r| Some(r.manifest.template.clone()))),
    required("seed", Get::Int(|r| Some(r.manifest.seed as i64))),
    required("diff", Get::Text(|r| Some(r.manifest.diff.clone()))),
    optional(
        "file",
        Get::Text(|r| r.manifest.location.as_ref().map(|l| l.file.clone())),
    ),
    optional(
        "function",
        Get::Text(|r| r.manifest.location.as_ref()?.function.clone()),
    ),
    optional(
        "line_start",
        Get::Int(|r| r.manifest.location.as_ref().map(|l| l.line_start as i64)),
    ),
    optional(
        "line_end",
        Get::Int(|r| r.manifest.location.as_ref().map(|l| l.line_end as i64)),
    ),
    optional(
        "component",
        Get::Text(|r| r.manifest.location.as_ref()?.component.clone()),
    ),
    optional("commit", Get::Text(|r| r.manifest.commit.clone())),
    optional("trace", Get::Text(|r| r.manifest.trace.clone())),
    optional(
        "keyword_names_it",
        Get::Bool(|r| r.manifest.validation.non_trivial.as_ref()?.keyword_names_it),
    ),
    required(
        "validation_json",
        Get::Text(|r| Some(json(&r.manifest.validation))),
    ),
    required("clean_json", Get::Text(|r| Some(json(&r.manifest.clean)))),
    optional(
        "injected_json",
        Get::Text(|r| r.manifest.injected.as_ref().map(json)),
    ),
    optional("departure_step", Get::Int(|r| r.departure.as_ref()?.step)),
    optional(
        "departure_span",
        Get::Text(|r| r.departure.as_ref().map(|d| d.span.clone())),
    ),
    optional(
        "departure_agent",
        Get::Text(|r| r.departure.as_ref()?.agent.clone()),
    ),
];

/// The file schema in Parquet's message-type syntax, built from [`COLUMNS`].
pub fn schema() -> String {
    let fields: String = COLUMNS
        .iter()
        .map(|c| {
            let repetition = if c.optional { "optional" } else { "required" };
            let physical = match c.get {
                Get::Text(_) => "binary",
                Get::Int(_) => "int64",
                Get::Bool(_) => "boolean",
            };
            let logical = if matches!(c.get, Get::Text(_)) {
                " (STRING)"
            } else {
                ""
            };
            format!("    {repetition} {physical} {}{logical};\n", c.name)
        })
        .collect();
    format!("message corpus_record {{\n{fields}}}")
}

/// One column's values for `records`: the non-null values, and the definition levels
/// (1 = present, 0 = null) when the column is optional.
fn values<T>(
    column: &Column,
    records: &[&Record],
    get: fn(&Record) -> Option<T>,
) -> (Vec<T>, Option<Vec<i16>>) {
    let all: Vec<Option<T>> = records.iter().map(|r| get(r)).collect();
    let defs = column
        .optional
        .then(|| all.iter().map(|v| i16::from(v.is_some())).collect());
    debug_assert!(column.optional || all.iter().all(Option::is_some));
    (all.into_iter().flatten().collect(), defs)
}

/// Writes `records` to `path` as Parquet, through a temporary file and a rename so that a
/// reader never sees half a file.
pub fn write(path: &Path, records: &[&Record]) -> Result<(), CorpusError> {
    let fail = |what: String| {
        move |source| CorpusError::Parquet {
            path: path.to_owned(),
            what,
            source,
        }
    };
    let schema = Arc::new(parse_message_type(&schema()).expect("the corpus schema parses"));
    let tmp = path.with_extension("partial");
    let file = std::fs::File::create(&tmp).map_err(|source| CorpusError::Io {
        path: tmp.clone(),
        source,
    })?;
    let props = Arc::new(WriterProperties::builder().build());
    let mut writer = SerializedFileWriter::new(file, schema, props)
        .map_err(fail("opening the writer".into()))?;
    let mut group = writer
        .next_row_group()
        .map_err(fail("starting the row group".into()))?;
    for column in COLUMNS {
        let mut out = group
            .next_column()
            .map_err(fail(format!("starting column {}", column.name)))?
            .expect("the schema has a field per column");
        let written = match column.get {
            Get::Text(get) => {
                let (present, defs) = values(column, records, get);
                let present: Vec<ByteArray> = present
                    .into_iter()
                    .map(|s| ByteArray::from(s.into_bytes()))
                    .collect();
                out.typed::<ByteArrayType>()
                    .write_batch(&present, defs.as_deref(), None)
            }
            Get::Int(get) => {
                let (present, defs) = values(column, records, get);
                out.typed::<Int64Type>()
                    .write_batch(&present, defs.as_deref(), None)
            }
            Get::Bool(get) => {
                let (present, defs) = values(column, records, get);
                out.typed::<BoolType>()
                    .write_batch(&present, defs.as_deref(), None)
            }
        };
        written.map_err(fail(format!("writing column {}", column.name)))?;
        out.close()
            .map_err(fail(format!("closing column {}", column.name)))?;
    }
    group
        .close()
        .map_err(fail("closing the row group".into()))?;
    writer.close().map_err(fail("closing the file".into()))?;
    std::fs::rename(&tmp, path).map_err(|source| CorpusError::Io {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::injection::{Manifest, RunSummary};
    use crate::validate::{Check, NonTriviality, Validation};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    fn record(id: &str, located: bool) -> Record {
        let clean = RunSummary {
            end: "answer".into(),
            success: true,
            features: Default::default(),
            contained: Vec::new(),
        };
        let mut validation = Validation::not_applied(String::new());
        validation.applies = Check::pass("applied");
        validation.valid = true;
        validation.non_trivial = located.then(|| NonTriviality {
            keyword_available: true,
            keyword_answer: Some("P1".into()),
            keyword_names_it: Some(false),
            detail: "answers P1".into(),
        });
        Record {
            split: "test".into(),
            trace_id: format!("trace-{id}"),
            manifest: Manifest {
                id: id.into(),
                agent: "swe".into(),
                task: "swe-001".into(),
                deficiency: "P4".into(),
                variant: "v".into(),
                strategy: "template".into(),
                template: "swe/P4-v.toml".into(),
                seed: 7,
                diff: "--- a/x\n+++ b/x\n".into(),
                location: located.then(|| inject::Location {
                    file: "swe/loop.py".into(),
                    function: Some("run".into()),
                    line_start: 10,
                    line_end: 12,
                    component: Some("loop.termination".into()),
                }),
                commit: Some("abc".into()),
                clean: clean.clone(),
                injected: located.then_some(clean),
                validation,
                trace: Some("episodes/x/run/trace.jsonl".into()),
            },
            departure: None,
        }
    }

    #[test]
    fn records_read_back_with_their_nulls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corpus.parquet");
        let (a, b) = (record("a", true), record("b", false));
        write(&path, &[&a, &b]).unwrap();
        assert!(!path.with_extension("partial").exists());
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        assert_eq!(reader.metadata().file_metadata().num_rows(), 2);
        let rows: Vec<Vec<(String, Field)>> = reader
            .get_row_iter(None)
            .unwrap()
            .map(|r| r.unwrap().into_columns())
            .collect();
        let get = |row: usize, name: &str| {
            rows[row]
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("no column {name}"))
                .1
                .clone()
        };
        assert_eq!(get(0, "episode"), Field::Str("a".into()));
        assert_eq!(get(0, "trace_id"), Field::Str("trace-a".into()));
        assert_eq!(get(0, "seed"), Field::Long(7));
        assert_eq!(get(0, "line_start"), Field::Long(10));
        assert_eq!(get(0, "component"), Field::Str("loop.termination".into()));
        assert_eq!(get(0, "keyword_names_it"), Field::Bool(false));
        assert_eq!(get(1, "episode"), Field::Str("b".into()));
        for null in [
            "file",
            "function",
            "line_end",
            "keyword_names_it",
            "injected_json",
        ] {
            assert_eq!(get(1, null), Field::Null, "{null}");
        }
        let Field::Str(v) = get(1, "validation_json") else {
            panic!("validation_json is text")
        };
        let back: Validation = serde_json::from_str(&v).unwrap();
        assert_eq!(back, b.manifest.validation);
        assert_eq!(rows[0].len(), schema().matches(';').count());
    }

    #[test]
    fn an_empty_split_is_a_valid_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("val.parquet");
        write(&path, &[]).unwrap();
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        assert_eq!(reader.metadata().file_metadata().num_rows(), 0);
    }
}
