"""Where videos come from, without Dagster: a project's inputs (searches, URL lists, files) turned
into candidate videos (`inputs`), their stable ids (`video_ids`), and the yt-dlp client that
searches and downloads (`ytdlp`). The `download_client` resource wraps the client for the stages.
Probing a downloaded file lives in `core.media`, which frame extraction shares."""
