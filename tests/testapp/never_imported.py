"""A module no job row may cause to be imported: importing it fails the tests loudly."""

raise AssertionError("tests.testapp.never_imported was imported because a job row named it")
