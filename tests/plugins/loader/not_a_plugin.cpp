// An ordinary shared library with no axengine descriptor: discovery must skip it quietly.
extern "C" int axengine_test_not_a_plugin_answer() { return 42; }
