//! A fault-injecting LLM provider simulator.
