"""The checking engine: what runs the properties and where its results go (outputs: every result file checked
before the work starts and written whole; inputs: every file the harness reads back, validated, each error
naming the file and what is wrong with it)."""
