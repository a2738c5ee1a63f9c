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

use crate::generate::{CorpusError, Record};

/// The file schema, in the order the columns are written below.
pub const SCHEMA: &str = "message corpus_record {
    required binary split (STRING);
    required binary trace_id (STRING);
    required binary episode (STRING);
    required binary agent (STRING);
    required binary task (STRING);
    required binary deficiency (STRING);
    required binary variant (STRING);
    required binary strategy (STRING);
    required binary template (STRING);
    required int64 seed;
    required binary diff (STRING);
    optional binary file (STRING);
    optional binary function (STRING);
    optional int64 line_start;
    optional int64 line_end;
    optional binary component (STRING);
    optional binary commit (STRING);
    optional binary trace (STRING);
    optional boolean keyword_names_it;
    required binary validation_json (STRING);
    required binary clean_json (STRING);
    optional binary injected_json (STRING);
}";

/// One column's values: required or optional (`None` is a null).
enum Column {
    Text(Vec<Option<String>>),
    Int(Vec<Option<i64>>),
    Bool(Vec<Option<bool>>),
}

fn text(records: &[&Record], f: impl Fn(&Record) -> Option<String>) -> Column {
    Column::Text(records.iter().map(|r| f(r)).collect())
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("a manifest part serialises")
}

fn columns(records: &[&Record]) -> Vec<Column> {
    let loc = |r: &Record| r.manifest.location.clone();
    vec![
        text(records, |r| Some(r.split.clone())),
        text(records, |r| Some(r.trace_id.clone())),
        text(records, |r| Some(r.manifest.id.clone())),
        text(records, |r| Some(r.manifest.agent.clone())),
        text(records, |r| Some(r.manifest.task.clone())),
        text(records, |r| Some(r.manifest.deficiency.clone())),
        text(records, |r| Some(r.manifest.variant.clone())),
        text(records, |r| Some(r.manifest.strategy.clone())),
        text(records, |r| Some(r.manifest.template.clone())),
        Column::Int(
            records
                .iter()
                .map(|r| Some(r.manifest.seed as i64))
                .collect(),
        ),
        text(records, |r| Some(r.manifest.diff.clone())),
        text(records, |r| loc(r).map(|l| l.file)),
        text(records, |r| loc(r).and_then(|l| l.function)),
        Column::Int(
            records
                .iter()
                .map(|r| loc(r).map(|l| l.line_start as i64))
                .collect(),
        ),
        Column::Int(
            records
                .iter()
                .map(|r| loc(r).map(|l| l.line_end as i64))
                .collect(),
        ),
        text(records, |r| loc(r).and_then(|l| l.component)),
        text(records, |r| r.manifest.commit.clone()),
        text(records, |r| r.manifest.trace.clone()),
        Column::Bool(
            records
                .iter()
                .map(|r| {
                    r.manifest
                        .validation
                        .non_trivial
                        .as_ref()
                        .and_then(|n| n.keyword_names_it)
                })
                .collect(),
        ),
        text(records, |r| Some(json(&r.manifest.validation))),
        text(records, |r| Some(json(&r.manifest.clean))),
        text(records, |r| r.manifest.injected.as_ref().map(json)),
    ]
}

/// Non-null values and the definition levels (1 = present, 0 = null) of an optional column.
fn levels<T: Clone>(values: &[Option<T>]) -> (Vec<T>, Vec<i16>) {
    let present = values.iter().flatten().cloned().collect();
    let defs = values.iter().map(|v| i16::from(v.is_some())).collect();
    (present, defs)
}

/// Writes `records` to `path` as Parquet, through a temporary file and a rename so that a
/// reader never sees half a file.
pub fn write(path: &Path, records: &[&Record]) -> Result<(), CorpusError> {
    let fail = |what: &str, e: parquet::errors::ParquetError| {
        CorpusError::Plan(format!("{}: {what}: {e}", path.display()))
    };
    let schema = Arc::new(parse_message_type(SCHEMA).expect("the corpus schema parses"));
    let tmp = path.with_extension("partial");
    let file = std::fs::File::create(&tmp).map_err(|source| CorpusError::Io {
        path: tmp.clone(),
        source,
    })?;
    let props = Arc::new(WriterProperties::builder().build());
    let mut writer = SerializedFileWriter::new(file, schema.clone(), props)
        .map_err(|e| fail("opening the writer", e))?;
    let mut group = writer
        .next_row_group()
        .map_err(|e| fail("starting the row group", e))?;
    let mut columns = columns(records).into_iter();
    let fields = schema.get_fields();
    let mut index = 0;
    while let Some(mut out) = group
        .next_column()
        .map_err(|e| fail("starting a column", e))?
    {
        let column = columns.next().expect("one column per schema field");
        let optional = fields[index].is_optional();
        let name = fields[index].name().to_owned();
        let defs_for = |defs: Vec<i16>| optional.then_some(defs);
        let written = match column {
            Column::Text(values) => {
                let (present, defs) = levels(&values);
                let present: Vec<ByteArray> = present
                    .into_iter()
                    .map(|s| ByteArray::from(s.into_bytes()))
                    .collect();
                out.typed::<ByteArrayType>()
                    .write_batch(&present, defs_for(defs).as_deref(), None)
            }
            Column::Int(values) => {
                let (present, defs) = levels(&values);
                out.typed::<Int64Type>()
                    .write_batch(&present, defs_for(defs).as_deref(), None)
            }
            Column::Bool(values) => {
                let (present, defs) = levels(&values);
                out.typed::<BoolType>()
                    .write_batch(&present, defs_for(defs).as_deref(), None)
            }
        };
        written.map_err(|e| fail(&format!("writing column {name}"), e))?;
        out.close()
            .map_err(|e| fail(&format!("closing column {name}"), e))?;
        index += 1;
    }
    group
        .close()
        .map_err(|e| fail("closing the row group", e))?;
    writer.close().map_err(|e| fail("closing the file", e))?;
    std::fs::rename(&tmp, path).map_err(|source| CorpusError::Io {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Manifest, RunSummary};
    use crate::validate::{Check, NonTriviality, Validation};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    fn record(id: &str, located: bool) -> Record {
        let clean = RunSummary {
            end: "answer".into(),
            success: true,
            features: Default::default(),
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
        assert_eq!(rows[0].len(), SCHEMA.matches(';').count());
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
