//! docsfab's composition runtime.
