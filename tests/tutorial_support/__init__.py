"""Reading docs/tutorial.md into steps and running them as a reader would."""
