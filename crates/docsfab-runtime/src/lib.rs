//! docsfab's composition runtime.
pub mod composition;
