//! Output rows.

use std::marker::PhantomData;

use serde::Serialize;

use crate::{Error, Result};

/// Collects the rows a handler call emits. Each row must serialize to a JSON object matching the
/// processor's `OUTPUT_SCHEMA`; the host rejects rows that do not.
pub struct Emitter<O> {
    /// Rows as JSON text, handed to the host as the call's result.
    json: Vec<String>,
    /// Rows kept as values instead, when the test harness returns them to a test.
    #[cfg(not(target_arch = "wasm32"))]
    typed: Option<Vec<O>>,
    _row: PhantomData<fn(O)>,
}

impl<O: Serialize> Emitter<O> {
    pub(crate) fn json() -> Self {
        Emitter {
            json: Vec::new(),
            #[cfg(not(target_arch = "wasm32"))]
            typed: None,
            _row: PhantomData,
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn typed() -> Self {
        Emitter {
            json: Vec::new(),
            typed: Some(Vec::new()),
            _row: PhantomData,
        }
    }

    /// Emits one row.
    pub fn emit(&mut self, row: O) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(rows) = &mut self.typed {
            // Serialize anyway, so that a test fails where the host would.
            let json = serde_json::to_value(&row).map_err(|e| Error::json("output row", e))?;
            if !json.is_object() {
                return Err(Error::new(
                    crate::ErrorKind::Json,
                    format!("output row must be a JSON object, got {json}"),
                ));
            }
            rows.push(row);
            return Ok(());
        }
        let json = serde_json::to_string(&row).map_err(|e| Error::json("output row", e))?;
        self.json.push(json);
        Ok(())
    }

    /// How many rows have been emitted in this call.
    pub fn len(&self) -> usize {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(rows) = &self.typed {
            return rows.len();
        }
        self.json.len()
    }

    /// Whether no row has been emitted in this call.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn into_json(self) -> Vec<String> {
        self.json
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn into_typed(self) -> Vec<O> {
        self.typed.unwrap_or_default()
    }
}
