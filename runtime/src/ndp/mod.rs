//! NDP device client (placeholder while building).
#[allow(missing_docs, non_camel_case_types, non_upper_case_globals, dead_code)]
pub mod abi;
