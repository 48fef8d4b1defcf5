"""Optional integrations, each an installed app of its own."""
