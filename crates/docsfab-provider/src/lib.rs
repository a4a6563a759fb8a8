//! docsfab's provider transports and the in-turn replay driver.
