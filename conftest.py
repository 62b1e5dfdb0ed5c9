# The project's rootdir conftest: nothing to configure; the plugin loads through its entry point.
