// the plugin source
