"""The managed executor: runs `managed` targets' commands in a bubblewrap sandbox."""
