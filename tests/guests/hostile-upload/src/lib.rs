//! A processor that misbehaves in `describe` and `init`, where no input row can tell it
//! what to do: its behaviour is picked by a marker in its data, which the tests patch in
//! the built component (same length, so the component stays valid). The marker reads
//! `statebox-hostile-mode:` followed by the mode, padded with dots to [`MARKER_LEN`] bytes:
//!
//! | mode | does |
//! |---|---|
//! | `normal` | declares nothing, emits nothing: a well-behaved processor |
//! | `huge-name` | `describe` returns a name of 50 MiB |
//! | `huge-var-name` | `init` declares a state variable whose name is 1 MiB long |
//! | `spin-init` | `init` spins forever (until the call's deadline) |
//! | `spin-event-time` | `init` spins forever, but only in event-time mode (so the upload, which runs `init` in processing time, succeeds and a pipeline in event time never opens) |
//!
//! Written against the raw bindings, not `export_processor!`: the SDK's name is a constant.

/// Length of the whole marker, prefix included.
pub const MARKER_LEN: usize = 48;

/// The marker; `#[used]` and read byte by byte with volatile reads, so the compiler keeps
/// it in the data segment and cannot fold the mode into the code.
#[used]
static MARKER: [u8; MARKER_LEN] = *b"statebox-hostile-mode:normal....................";

/// The mode the marker names.
pub fn mode() -> String {
    let bytes: Vec<u8> = (0..MARKER_LEN)
        // SAFETY: every index is within the static array.
        .map(|i| unsafe { std::ptr::read_volatile(MARKER.as_ptr().add(i)) })
        .collect();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    text.trim_start_matches("statebox-hostile-mode:")
        .trim_end_matches('.')
        .to_owned()
}

#[cfg(target_arch = "wasm32")]
mod guest {
    use std::hint::black_box;

    use statebox_sdk::__private::{
        BatchError, BatchGuest, Guest, ProcessorError, ProcessorInfo, WitExpiredTimerInfo,
        WitKeyRows, WitKeyTimer, WitTimeMode, WitTimerValues,
    };

    struct Hostile;

    impl Guest for Hostile {
        fn describe() -> ProcessorInfo {
            let name = if super::mode() == "huge-name" {
                "n".repeat(50 << 20)
            } else {
                "hostile".to_owned()
            };
            ProcessorInfo {
                name,
                output_schema: "k string".to_owned(),
                input_schema: None,
                output_event_time_column: None,
            }
        }

        fn init(time_mode: WitTimeMode) -> Result<(), ProcessorError> {
            match super::mode().as_str() {
                "spin-init" => {
                    let mut x = 0u64;
                    loop {
                        x = black_box(x.wrapping_add(1));
                    }
                }
                "spin-event-time" if matches!(time_mode, WitTimeMode::EventTime) => {
                    let mut x = 0u64;
                    loop {
                        x = black_box(x.wrapping_add(1));
                    }
                }
                "huge-var-name" => {
                    use statebox_sdk::__private::bindings::statebox::processor::handle;
                    handle::get_value_state(&"v".repeat(1 << 20), "long", None)
                        .map(drop)
                        .map_err(|e| ProcessorError::Failed(e.message))
                }
                _ => Ok(()),
            }
        }

        fn handle_input_rows(
            _key: String,
            _rows: Vec<String>,
            _timer_values: WitTimerValues,
        ) -> Result<Vec<String>, ProcessorError> {
            Ok(Vec::new())
        }

        fn handle_expired_timer(
            _key: String,
            _timer_values: WitTimerValues,
            _info: WitExpiredTimerInfo,
        ) -> Result<Vec<String>, ProcessorError> {
            Ok(Vec::new())
        }

        fn handle_initial_state(
            _key: String,
            _initial_state: String,
            _timer_values: WitTimerValues,
        ) -> Result<(), ProcessorError> {
            Ok(())
        }

        fn close() -> Result<(), ProcessorError> {
            Ok(())
        }
    }

    impl BatchGuest for Hostile {
        fn positional_rows() -> bool {
            false
        }

        fn handle_input_batch(
            groups: Vec<WitKeyRows>,
            _columns: Option<Vec<String>>,
            _timer_values: WitTimerValues,
        ) -> Result<Vec<Vec<String>>, BatchError> {
            Ok(groups.iter().map(|_| Vec::new()).collect())
        }

        fn handle_expired_timers(
            timers: Vec<WitKeyTimer>,
            _timer_values: WitTimerValues,
        ) -> Result<Vec<Vec<String>>, BatchError> {
            Ok(timers.iter().map(|_| Vec::new()).collect())
        }
    }

    statebox_sdk::__private::bindings::__export_processor_world!(
        Hostile with_types_in statebox_sdk::__private::bindings
    );
}
