//! veRL rows as parquet through arrow-rs's low-level column writer (no arrow arrays): one leaf
//! column at a time, with the definition and repetition levels of the nested `prompt` list.

use super::{ExportError, ExportRow};
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::path::Path;
use std::sync::Arc;

/// The veRL row layout. `prompt` follows parquet's LIST convention, so readers (pyarrow, HF
/// datasets) see `list<struct<role, content>>`.
const SCHEMA: &str = "
message verl_row {
  required binary data_source (STRING);
  required group prompt (LIST) {
    repeated group list {
      required group element {
        required binary role (STRING);
        required binary content (STRING);
      }
    }
  }
  required binary ability (STRING);
  required group reward_model {
    required binary style (STRING);
    required binary ground_truth (STRING);
  }
  required group extra_info {
    required binary split (STRING);
    required int64 index;
    required binary instance_id (STRING);
    required binary repo (STRING);
    required binary subtask (STRING);
  }
}";

/// Rows per row group.
const GROUP_ROWS: usize = 2048;

/// One leaf column's data, in schema order.
enum Leaf {
    /// Strings of a required top-level or struct field, one per row.
    Text(Vec<ByteArray>),
    /// Strings of the prompt list's messages, with their levels.
    ListText(Vec<ByteArray>, Vec<i16>, Vec<i16>),
    /// Integers, one per row.
    Int(Vec<i64>),
}

fn text(rows: &[ExportRow], f: impl Fn(&ExportRow) -> &str) -> Leaf {
    Leaf::Text(rows.iter().map(|r| ByteArray::from(f(r))).collect())
}

/// Each row's prompt is one user message: definition level 1 (list present, element present),
/// repetition level 0 (a new row).
fn message_field(rows: &[ExportRow], f: impl Fn(&ExportRow) -> &str) -> Leaf {
    let values = rows.iter().map(|r| ByteArray::from(f(r))).collect();
    Leaf::ListText(values, vec![1; rows.len()], vec![0; rows.len()])
}

fn leaves(rows: &[ExportRow]) -> Vec<Leaf> {
    vec![
        text(rows, |r| &r.data_source),
        message_field(rows, |_| "user"),
        message_field(rows, |r| &r.prompt),
        text(rows, |r| &r.ability),
        text(rows, |_| "rule"),
        text(rows, |r| &r.ground_truth),
        text(rows, |r| &r.split),
        Leaf::Int(rows.iter().map(|r| r.index).collect()),
        text(rows, |r| &r.instance_id),
        text(rows, |r| &r.repo),
        text(rows, |r| &r.subtask),
    ]
}

/// Writes `rows` to `path` (uncompressed: the lean build has no codec).
pub fn write(rows: &[ExportRow], path: &Path) -> Result<(), ExportError> {
    let perr = |e: parquet::errors::ParquetError| ExportError::Parquet {
        path: path.to_path_buf(),
        msg: e.to_string(),
    };
    let schema = Arc::new(parse_message_type(SCHEMA).map_err(perr)?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::UNCOMPRESSED)
            .set_created_by(format!("sorft {}", env!("CARGO_PKG_VERSION")))
            .build(),
    );
    let file = std::fs::File::create(path).map_err(|source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut writer = SerializedFileWriter::new(file, schema, props).map_err(perr)?;
    for chunk in rows.chunks(GROUP_ROWS) {
        let mut group = writer.next_row_group().map_err(perr)?;
        let mut data = leaves(chunk).into_iter();
        while let Some(mut col) = group.next_column().map_err(perr)? {
            let Some(leaf) = data.next() else {
                return Err(ExportError::Invalid(
                    "parquet schema and row leaves disagree".into(),
                ));
            };
            match leaf {
                Leaf::Text(v) => col.typed::<ByteArrayType>().write_batch(&v, None, None),
                Leaf::ListText(v, d, r) => {
                    col.typed::<ByteArrayType>()
                        .write_batch(&v, Some(&d), Some(&r))
                }
                Leaf::Int(v) => col.typed::<Int64Type>().write_batch(&v, None, None),
            }
            .map_err(perr)?;
            col.close().map_err(perr)?;
        }
        group.close().map_err(perr)?;
    }
    writer.close().map_err(perr)?;
    Ok(())
}
