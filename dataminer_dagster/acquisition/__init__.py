"""Where videos come from, without Dagster: a project's inputs (searches, URL lists, files) turned
into candidate videos (`inputs`), their stable ids (`video_ids`), the yt-dlp client that searches
and downloads (`ytdlp`, with the options merged from a video's projects in `options` and its
outcomes in `errors`), and its politeness towards hosts (`politeness`: pauses, request turns and
download slots per host). The `download_client` resource wraps the client for the stages.
Probing a downloaded file lives in `core.media`, which frame extraction shares."""
